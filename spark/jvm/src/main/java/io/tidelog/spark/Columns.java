package io.tidelog.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The columns a read can produce, with their Spark types: exactly those of the Python source
 * (spark/plan.py {@code COLUMNS} and {@code HEADERS_COLUMN}), in the same order.
 */
final class Columns {
  static final String TOPIC = "topic";
  static final String BROKER_SET = "broker_set";
  static final String QUEUE = "queue";
  static final String OFFSET = "offset";
  static final String KEY = "key";
  static final String TAGS = "tags";
  static final String BODY = "body";
  static final String TIMESTAMP = "timestamp";
  static final String HEADERS = "headers";

  private static final Map<String, DataType> TYPES = new LinkedHashMap<>();

  static {
    TYPES.put(TOPIC, DataTypes.StringType);
    TYPES.put(BROKER_SET, DataTypes.StringType);
    TYPES.put(QUEUE, DataTypes.IntegerType);
    TYPES.put(OFFSET, DataTypes.LongType);
    TYPES.put(KEY, DataTypes.StringType);
    TYPES.put(TAGS, DataTypes.StringType);
    TYPES.put(BODY, DataTypes.BinaryType);
    TYPES.put(TIMESTAMP, DataTypes.TimestampType);
    TYPES.put(HEADERS, DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true));
  }

  private Columns() {}

  /** The full schema; {@code headers} only with includeHeaders (as the Python source). */
  static StructType schema(boolean includeHeaders) {
    List<StructField> fields = new ArrayList<>();
    for (Map.Entry<String, DataType> e : TYPES.entrySet()) {
      if (includeHeaders || !e.getKey().equals(HEADERS)) {
        fields.add(DataTypes.createStructField(e.getKey(), e.getValue(), true));
      }
    }
    return DataTypes.createStructType(fields);
  }

  /** Fails naming any column the source cannot produce, or a type it does not produce it as. */
  static void check(StructType schema) {
    for (StructField f : schema.fields()) {
      DataType want = TYPES.get(f.name());
      if (want == null) {
        throw new IllegalArgumentException(
            "the tidelog data-port reader has no column " + f.name() + "; it has " + TYPES.keySet());
      }
      if (!want.sameType(f.dataType())) {
        throw new IllegalArgumentException(
            "column " + f.name() + " is " + want.simpleString() + ", not " + f.dataType().simpleString());
      }
    }
  }
}
