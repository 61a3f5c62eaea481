package io.tidelog.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The option {@code plan}: the JSON the Python planner wrote (spark/dataport.py {@code plan_json}),
 * parsed and checked. Every malformed field is an IllegalArgumentException naming it.
 *
 * <pre>
 * {"version": 1, "includeHeaders": false, "failOnDataLoss": true, "fetchMaxMessages": 4096,
 *  "readTimeoutMs": 60000, "readAhead": 2,
 *  "partitions": [{"topic": "t", "brokerSet": "broker-a", "queue": 0, "start": 0, "end": 42,
 *                  "earliest": false, "replicas": ["127.0.0.1:9811", "127.0.0.1:9821"]}]}
 * </pre>
 */
final class ReadPlan {
  static final String OPTION = "plan";
  static final int VERSION = 1;
  private static final ObjectMapper JSON = new ObjectMapper();

  final boolean includeHeaders;
  final ReadSettings settings;
  final List<RangePartition> partitions;

  private ReadPlan(boolean includeHeaders, ReadSettings settings, List<RangePartition> partitions) {
    this.includeHeaders = includeHeaders;
    this.settings = settings;
    this.partitions = Collections.unmodifiableList(partitions);
  }

  static ReadPlan parse(CaseInsensitiveStringMap options) {
    String text = options.get(OPTION);
    if (text == null || text.isBlank()) {
      throw bad(
          "option plan is required: read through tidelog.spark.read_dataport(spark, ...), which plans"
              + " the ranges and sets it");
    }
    JsonNode doc;
    try {
      doc = JSON.readTree(text);
    } catch (JsonProcessingException e) {
      throw bad("option plan is not valid JSON: " + e.getOriginalMessage());
    }
    if (doc == null || !doc.isObject()) {
      throw bad("option plan must be a JSON object");
    }
    long version = integer(doc, "version", "plan", 0, Long.MAX_VALUE);
    if (version != VERSION) {
      throw bad("plan version " + version + " is not " + VERSION + ": rebuild the jar (make spark)");
    }
    ReadSettings settings =
        new ReadSettings(
            bool(doc, "failOnDataLoss", "plan"),
            (int) integer(doc, "fetchMaxMessages", "plan", 1, 1_000_000),
            integer(doc, "readTimeoutMs", "plan", 1, Long.MAX_VALUE),
            (int) integer(doc, "readAhead", "plan", 0, 16));
    JsonNode parts = doc.get("partitions");
    if (parts == null || !parts.isArray()) {
      throw bad("plan.partitions must be an array");
    }
    List<RangePartition> out = new ArrayList<>();
    for (int i = 0; i < parts.size(); i++) {
      out.add(partition(parts.get(i), "plan.partitions[" + i + "]"));
    }
    return new ReadPlan(bool(doc, "includeHeaders", "plan"), settings, out);
  }

  private static RangePartition partition(JsonNode p, String where) {
    if (!p.isObject()) {
      throw bad(where + " must be an object");
    }
    String topic = text(p, "topic", where);
    String brokerSet = text(p, "brokerSet", where);
    int queue = (int) integer(p, "queue", where, 0, 65535);
    long start = integer(p, "start", where, 0, Long.MAX_VALUE);
    long end = integer(p, "end", where, 0, Long.MAX_VALUE);
    if (end < start) {
      throw bad(where + ": end " + end + " is before start " + start);
    }
    JsonNode replicas = p.get("replicas");
    if (replicas == null || !replicas.isArray() || replicas.isEmpty()) {
      throw bad(where + ".replicas must be a non-empty array of data-port addresses (host:port)");
    }
    String[] addresses = new String[replicas.size()];
    for (int i = 0; i < addresses.length; i++) {
      JsonNode a = replicas.get(i);
      if (!a.isTextual() || !Address.valid(a.asText())) {
        throw bad(where + ".replicas[" + i + "] is not a host:port address: " + a);
      }
      addresses[i] = a.asText();
    }
    return new RangePartition(topic, brokerSet, queue, start, end, bool(p, "earliest", where), addresses);
  }

  /** "topic broker-a:0 [0, 10), ...": the ranges, for the plan's description in explain(). */
  String describe() {
    StringBuilder b = new StringBuilder().append(partitions.size()).append(" ranges");
    long rows = 0;
    for (RangePartition p : partitions) {
      rows += p.end - p.start;
    }
    return b.append(", ").append(rows).append(" offsets").toString();
  }

  private static String text(JsonNode node, String field, String where) {
    JsonNode v = node.get(field);
    if (v == null || !v.isTextual() || v.asText().isEmpty()) {
      throw bad(where + "." + field + " must be a non-empty string, not " + v);
    }
    return v.asText();
  }

  private static long integer(JsonNode node, String field, String where, long low, long high) {
    JsonNode v = node.get(field);
    if (v == null || !v.isIntegralNumber() || !v.canConvertToLong()) {
      throw bad(where + "." + field + " must be an integer, not " + v);
    }
    long n = v.asLong();
    if (n < low || n > high) {
      throw bad(where + "." + field + " must be in " + low + ".." + high + ", not " + n);
    }
    return n;
  }

  private static boolean bool(JsonNode node, String field, String where) {
    JsonNode v = node.get(field);
    if (v == null || !v.isBoolean()) {
      throw bad(where + "." + field + " must be true or false, not " + v);
    }
    return v.asBoolean();
  }

  private static IllegalArgumentException bad(String message) {
    return new IllegalArgumentException("tidelog-dataport: " + message);
  }
}
