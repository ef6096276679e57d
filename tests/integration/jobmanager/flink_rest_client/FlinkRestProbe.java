/*
 * Asks a REST endpoint with Apache Flink's own REST client (org.apache.flink.runtime.rest.RestClient) and
 * decodes each answer with Flink's own response classes, as Flink's tools do: a decoding failure is a
 * mismatch between Weir's REST API and Flink's. Used by tests/integration/jobmanager/test_flink_rest_client.py
 * (compiled there with javac against the jars deploy/local/flink-cli.sh installs from Maven Central).
 *
 *   java -cp "$FLINK_LIB/*:CLASSES" FlinkRestProbe HOST PORT < requests
 *
 * One request per input line, a JSON object: {"headers": "JobStatusInfoHeaders" (a MessageHeaders class of
 * Flink's REST messages, by its simple name), "path": {"jobid": "...", "vertexid": "...", "taskmanagerid":
 * "...", "checkpointid": "...", ...} (its path parameters, any other than a job's, vertex's or TaskManager's
 * id resolved from its text as Flink's router resolves it), "body": {...} (its request body, decoded into the request class by Flink's
 * mapper; absent: Flink's empty body)}. One answer per request on standard output, a JSON line:
 * {"headers", "ok": true, "response": the decoded response written back by Flink's mapper, "result": what
 * Flink's client makes of a job's execution result} or {"headers", "ok": false, "error": why}.
 */

import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.JobID;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.runtime.clusterframework.types.ResourceID;
import org.apache.flink.runtime.jobgraph.JobVertexID;
import org.apache.flink.runtime.jobmaster.JobResult;
import org.apache.flink.runtime.rest.RestClient;
import org.apache.flink.runtime.rest.messages.EmptyRequestBody;
import org.apache.flink.runtime.rest.messages.JobIDPathParameter;
import org.apache.flink.runtime.rest.messages.JobVertexIdPathParameter;
import org.apache.flink.runtime.rest.messages.MessageHeaders;
import org.apache.flink.runtime.rest.messages.MessageParameters;
import org.apache.flink.runtime.rest.messages.MessagePathParameter;
import org.apache.flink.runtime.rest.messages.RequestBody;
import org.apache.flink.runtime.rest.messages.ResponseBody;
import org.apache.flink.runtime.rest.messages.job.JobExecutionResultResponseBody;
import org.apache.flink.runtime.rest.messages.taskmanager.TaskManagerIdPathParameter;
import org.apache.flink.runtime.rest.util.RestMapperUtils;
import org.apache.flink.util.SerializedThrowable;

import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.JsonNode;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.flink.shaded.jackson2.com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

public final class FlinkRestProbe {

    private static final String[] PACKAGES = {
        "org.apache.flink.runtime.rest.messages.",
        "org.apache.flink.runtime.rest.messages.job.",
        "org.apache.flink.runtime.rest.messages.checkpoints.",
        "org.apache.flink.runtime.rest.messages.cluster.",
        "org.apache.flink.runtime.rest.messages.taskmanager.",
        "org.apache.flink.runtime.rest.messages.dataset.",
    };
    private static final long TIMEOUT_S = 60;

    private FlinkRestProbe() {}

    public static void main(String[] args) throws Exception {
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        ObjectMapper mapper = RestMapperUtils.getStrictObjectMapper();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        try (RestClient client = new RestClient(new Configuration(), executor)) {
            BufferedReader in =
                    new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isBlank()) {
                    continue;
                }
                JsonNode request = mapper.readTree(line);
                ObjectNode answer = mapper.createObjectNode();
                answer.put("headers", request.get("headers").asText());
                try {
                    ResponseBody response = send(client, host, port, mapper, request);
                    answer.put("ok", true);
                    answer.set("response", mapper.valueToTree(response));
                    if (response instanceof JobExecutionResultResponseBody) {
                        JobResult result = ((JobExecutionResultResponseBody) response).getJobExecutionResult();
                        if (result != null) {
                            answer.set("result", clientView(mapper, result));
                        }
                    }
                } catch (Exception e) {
                    answer.put("ok", false);
                    answer.put("error", describe(e));
                }
                System.out.println(mapper.writeValueAsString(answer));
                System.out.flush();
            }
        } finally {
            executor.shutdownNow();
        }
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    private static ResponseBody send(
            RestClient client, String host, int port, ObjectMapper mapper, JsonNode request)
            throws Exception {
        MessageHeaders headers = headers(request.get("headers").asText());
        MessageParameters parameters = headers.getUnresolvedMessageParameters();
        JsonNode path = request.get("path");
        for (Object each : parameters.getPathParameters()) {
            MessagePathParameter parameter = (MessagePathParameter) each;
            JsonNode value = path == null ? null : path.get(parameter.getKey());
            if (value == null) {
                throw new IllegalArgumentException("no value for path parameter " + parameter.getKey());
            }
            if (parameter instanceof JobIDPathParameter) {
                ((JobIDPathParameter) parameter).resolve(JobID.fromHexString(value.asText()));
            } else if (parameter instanceof JobVertexIdPathParameter) {
                ((JobVertexIdPathParameter) parameter).resolve(JobVertexID.fromHexString(value.asText()));
            } else if (parameter instanceof TaskManagerIdPathParameter) {
                ((TaskManagerIdPathParameter) parameter).resolve(new ResourceID(value.asText()));
            } else {
                parameter.resolveFromString(value.asText()); // a checkpoint's, dataset's or trigger's id
            }
        }
        JsonNode body = request.get("body");
        RequestBody requestBody =
                body == null
                        ? EmptyRequestBody.getInstance()
                        : (RequestBody) mapper.treeToValue(body, headers.getRequestClass());
        return (ResponseBody)
                client.sendRequest(host, port, headers, parameters, requestBody)
                        .get(TIMEOUT_S, TimeUnit.SECONDS);
    }

    /** The MessageHeaders instance of a class named by its simple name (its INSTANCE or getInstance()). */
    private static MessageHeaders<?, ?, ?> headers(String simpleName) throws Exception {
        for (String prefix : PACKAGES) {
            Class<?> type;
            try {
                type = Class.forName(prefix + simpleName);
            } catch (ClassNotFoundException e) {
                continue;
            }
            for (Method method : type.getMethods()) {
                if (method.getName().equals("getInstance")
                        && method.getParameterCount() == 0
                        && Modifier.isStatic(method.getModifiers())) {
                    return (MessageHeaders<?, ?, ?>) method.invoke(null);
                }
            }
            Field field = type.getField("INSTANCE");
            return (MessageHeaders<?, ?, ?>) field.get(null);
        }
        throw new ClassNotFoundException("no MessageHeaders class " + simpleName);
    }

    /** What `flink run` in attached mode makes of a job's result: its JobExecutionResult, or the exception. */
    private static ObjectNode clientView(ObjectMapper mapper, JobResult result) {
        ObjectNode view = mapper.createObjectNode();
        view.put("jobId", result.getJobId().toHexString());
        view.put("netRuntime", result.getNetRuntime());
        try {
            JobExecutionResult done = result.toJobExecutionResult(FlinkRestProbe.class.getClassLoader());
            view.put("succeeded", true);
            view.put("executionJobId", done.getJobID().toHexString());
            view.put("executionNetRuntime", done.getNetRuntime());
        } catch (Exception e) {
            view.put("succeeded", false);
            view.put("exception", e.getClass().getName());
            view.put("message", e.getMessage());
            Throwable cause = e.getCause();
            if (cause != null) {
                ObjectNode described = view.putObject("cause");
                described.put("class", cause.getClass().getName());
                described.put("toString", cause.toString());
                described.put("message", cause.getMessage());
                if (cause instanceof SerializedThrowable) {
                    SerializedThrowable serialized = (SerializedThrowable) cause;
                    described.put("originalErrorClassName", serialized.getOriginalErrorClassName());
                    described.put("fullStringifiedStackTrace", serialized.getFullStringifiedStackTrace());
                }
            }
        }
        return view;
    }

    private static String describe(Throwable error) {
        StringBuilder out = new StringBuilder();
        for (Throwable t = error; t != null; t = t.getCause()) {
            if (out.length() > 0) {
                out.append(" <- ");
            }
            out.append(t.getClass().getName()).append(": ").append(t.getMessage());
            if (t.getCause() == t) {
                break;
            }
        }
        return out.toString();
    }
}
