package com.github.nexmark.flink.udf;

import java.nio.charset.StandardCharsets;
import org.apache.flink.table.functions.ScalarFunction;

/**
 * Nexmark q14's user function {@code count_char(s, c)}, under the class name the suite's q14.sql
 * declares ({@code CREATE FUNCTION count_char AS 'com.github.nexmark.flink.udf.CountChar'}), so
 * that the query file runs unmodified: how many bytes of {@code s}'s UTF-8 equal the first byte of
 * {@code c}'s; 0 for a NULL {@code s}. Weir's side is the Python function of the same name in
 * weir/tools/nexmark_functions.py.
 */
public class CountChar extends ScalarFunction {
  public long eval(String s, String c) {
    if (s == null) {
      return 0L;
    }
    byte wanted = c.getBytes(StandardCharsets.UTF_8)[0];
    long n = 0L;
    for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
      if (b == wanted) {
        n++;
      }
    }
    return n;
  }
}
