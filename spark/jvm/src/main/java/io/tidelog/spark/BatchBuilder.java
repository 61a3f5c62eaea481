package io.tidelog.spark;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Turns a chunk of records into a ColumnarBatch holding exactly the columns of the read schema
 * (pruned columns are never built), with the values spark/rows.py gives them: {@code timestamp}
 * is the broker's store time; {@code key} and {@code tags} are the KEYS and TAGS properties (null
 * when absent); {@code headers} the other properties (an empty map when none). Strings and bodies
 * are copied once, from the reply's bytes into the column; properties are parsed only when one of
 * those three columns is read, and only for records that have any.
 *
 * <p>The vectors are reused: a batch is valid until the next {@link #build}, as Spark's own
 * columnar readers do.
 */
final class BatchBuilder implements AutoCloseable {
  private static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.US_ASCII);

  private final String[] names;
  private final OnHeapColumnVector[] vectors;
  private final ColumnarBatch batch;
  private final byte[] topic;
  private final byte[] brokerSet;
  private final int queue;
  private final String where;
  private final boolean properties;
  // the non-reserved properties of one record: name and value bounds, to merge repeated names
  private int[] entries = new int[16];

  BatchBuilder(StructType schema, RangePartition range, int capacity) {
    StructField[] fields = schema.fields();
    names = new String[fields.length];
    vectors = new OnHeapColumnVector[fields.length];
    boolean props = false;
    for (int i = 0; i < fields.length; i++) {
      names[i] = fields[i].name();
      vectors[i] = new OnHeapColumnVector(capacity, fields[i].dataType());
      props |= names[i].equals(Columns.KEY) || names[i].equals(Columns.TAGS) || names[i].equals(Columns.HEADERS);
    }
    properties = props;
    batch = new ColumnarBatch(Arrays.copyOf(vectors, vectors.length, ColumnVector[].class));
    topic = range.topic.getBytes(StandardCharsets.UTF_8);
    brokerSet = range.brokerSet.getBytes(StandardCharsets.UTF_8);
    queue = range.queue;
    where = range.where();
  }

  ColumnarBatch build(RecordChunk c) {
    int n = c.size;
    for (int i = 0; i < vectors.length; i++) {
      OnHeapColumnVector v = vectors[i];
      v.reset();
      v.reserve(n);
      switch (names[i]) {
        case Columns.TOPIC -> constant(v, topic, n);
        case Columns.BROKER_SET -> constant(v, brokerSet, n);
        case Columns.QUEUE -> v.putInts(0, n, queue);
        case Columns.OFFSET -> v.putLongs(0, n, c.offsets, 0);
        case Columns.TIMESTAMP -> {
          for (int r = 0; r < n; r++) {
            v.putLong(r, c.storeTs[r] * 1000); // milliseconds -> Spark's microseconds
          }
        }
        case Columns.BODY -> {
          for (int r = 0; r < n; r++) {
            v.putByteArray(r, c.data, c.bodyAt[r], c.bodyLen[r]);
          }
        }
        case Columns.KEY, Columns.TAGS, Columns.HEADERS -> {
          // filled below, in one pass over each record's properties
        }
        default -> throw new IllegalStateException("unknown column " + names[i]);
      }
    }
    if (properties) {
      fillProperties(c);
    }
    batch.setNumRows(n);
    return batch;
  }

  /** One value for every row: its bytes once, every row pointing at them. */
  private static void constant(WritableColumnVector v, byte[] value, int n) {
    if (n == 0) {
      return;
    }
    int at = v.putByteArray(0, value, 0, value.length);
    for (int r = 1; r < n; r++) {
      v.putArray(r, at, value.length);
    }
  }

  private void fillProperties(RecordChunk c) {
    WritableColumnVector key = null;
    WritableColumnVector tags = null;
    WritableColumnVector headers = null;
    for (int i = 0; i < names.length; i++) {
      switch (names[i]) {
        case Columns.KEY -> key = vectors[i];
        case Columns.TAGS -> tags = vectors[i];
        case Columns.HEADERS -> headers = vectors[i];
        default -> { }
      }
    }
    WritableColumnVector hKeys = headers == null ? null : headers.getChild(0);
    WritableColumnVector hValues = headers == null ? null : headers.getChild(1);
    int mapped = 0; // entries in the map's key and value vectors so far
    byte[] d = c.data;
    for (int r = 0; r < c.size; r++) {
      int keyAt = -1, keyLen = 0, tagsAt = -1, tagsLen = 0, kept = 0;
      int pos = c.propsAt[r];
      int end = pos + c.propsLen[r];
      while (pos < end) {
        if (end - pos < 2) {
          throw corrupt(c, r, "a property name length is cut short");
        }
        int nlen = ((d[pos] & 0xFF) << 8) | (d[pos + 1] & 0xFF);
        int nameAt = pos + 2;
        if (end - nameAt < nlen + 4) {
          throw corrupt(c, r, "a property name runs past the properties block");
        }
        long vlen = Integer.toUnsignedLong(RecordChunk.i32(d, nameAt + nlen));
        int valueAt = nameAt + nlen + 4;
        if (valueAt + vlen > end) {
          throw corrupt(c, r, "a property value runs past the properties block");
        }
        // a repeated name keeps its first place and its last value, as the Python reader's dict
        if (same(d, nameAt, nlen, KEYS)) {
          keyAt = valueAt;
          keyLen = (int) vlen;
        } else if (same(d, nameAt, nlen, TAGS)) {
          tagsAt = valueAt;
          tagsLen = (int) vlen;
        } else if (headers != null) {
          kept = keep(d, kept, nameAt, nlen, valueAt, (int) vlen);
        }
        pos = valueAt + (int) vlen;
      }
      if (key != null) {
        put(key, r, d, keyAt, keyLen);
      }
      if (tags != null) {
        put(tags, r, d, tagsAt, tagsLen);
      }
      if (headers != null) {
        hKeys.reserve(mapped + kept);
        hValues.reserve(mapped + kept);
        for (int e = 0; e < kept; e++) {
          hKeys.putByteArray(mapped + e, d, entries[4 * e], entries[4 * e + 1]);
          hValues.putByteArray(mapped + e, d, entries[4 * e + 2], entries[4 * e + 3]);
        }
        headers.putArray(r, mapped, kept);
        mapped += kept;
      }
    }
  }

  private int keep(byte[] d, int kept, int nameAt, int nlen, int valueAt, int vlen) {
    for (int e = 0; e < kept; e++) {
      if (entries[4 * e + 1] == nlen && Arrays.equals(d, entries[4 * e], entries[4 * e] + nlen, d, nameAt, nameAt + nlen)) {
        entries[4 * e + 2] = valueAt;
        entries[4 * e + 3] = vlen;
        return kept;
      }
    }
    if (4 * (kept + 1) > entries.length) {
      entries = Arrays.copyOf(entries, entries.length * 2);
    }
    entries[4 * kept] = nameAt;
    entries[4 * kept + 1] = nlen;
    entries[4 * kept + 2] = valueAt;
    entries[4 * kept + 3] = vlen;
    return kept + 1;
  }

  private static void put(WritableColumnVector v, int row, byte[] d, int at, int len) {
    if (at < 0) {
      v.putNull(row);
    } else {
      v.putByteArray(row, d, at, len);
    }
  }

  private static boolean same(byte[] d, int at, int len, byte[] name) {
    return len == name.length && Arrays.equals(d, at, at + len, name, 0, name.length);
  }

  private IllegalStateException corrupt(RecordChunk c, int row, String reason) {
    return new IllegalStateException(
        where + ": the record at offset " + c.offsets[row] + " has malformed properties: " + reason);
  }

  @Override
  public void close() {
    batch.close();
  }
}
