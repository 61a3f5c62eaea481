package io.tidelog.spark;

import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;

/**
 * The records of one pull reply that belong to the range being read: the reply's bytes, checked,
 * with each kept record's fields found in one pass (what spark/records.py {@code scan} does).
 *
 * <p>A pull answers with whole stored records back to back (commitlog/FORMAT.md "Record" and
 * "Record batches"). The reply's CRC32C covers them all; each record's length and magic are
 * checked here, and that its fields add up to its length. Records past the range's end are counted
 * (the reply's count must match) but not kept. One instance is refilled for every reply: its
 * arrays are valid until the next {@link #fill}.
 *
 * <pre>
 * 0 total_size u32 | 4 magic u32 | 8 crc u32 | 12 flags u16 | 14 topic_len u16 | 16 queue_id u32 |
 * 20 epoch u32 | 24 queue_offset u64 | 32 phys_offset u64 | 40 born_ts u64 | 48 store_ts u64 |
 * 56 props_len u32 | 60 body_len u32 | 64 topic | properties | body
 * </pre>
 */
final class RecordChunk {
  static final int MAGIC = 0x7DE10601;
  static final int HEADER_SIZE = 64;
  private static final VarHandle I32 = MethodHandles.byteArrayViewVarHandle(int[].class, ByteOrder.BIG_ENDIAN);
  private static final VarHandle I64 = MethodHandles.byteArrayViewVarHandle(long[].class, ByteOrder.BIG_ENDIAN);

  byte[] data = new byte[0];
  int size;
  long[] offsets;
  long[] storeTs;
  int[] propsAt;
  int[] propsLen;
  int[] bodyAt;
  int[] bodyLen;

  RecordChunk(int capacity) {
    offsets = new long[capacity];
    storeTs = new long[capacity];
    propsAt = new int[capacity];
    propsLen = new int[capacity];
    bodyAt = new int[capacity];
    bodyLen = new int[capacity];
  }

  static int i32(byte[] b, int at) {
    return (int) I32.get(b, at);
  }

  static long i64(byte[] b, int at) {
    return (long) I64.get(b, at);
  }

  /**
   * Checks the pull reply {@code body} (its fields, then records from {@link Frames#PULLED_SIZE})
   * of a pull at {@code offset}, and keeps at most {@code keep} of its records. Damage is a
   * replica error (another replica holds the same bytes); so is a reply without records (a
   * replica whose confirmed offset is still below the planned end).
   */
  void fill(byte[] body, String address, long offset, int queue, int keep) throws DataPortException {
    if (body.length < Frames.PULLED_SIZE) {
      throw DataPortException.corrupt(address, offset, "a pull reply is shorter than its fields");
    }
    long next = i64(body, 0);
    long count = Integer.toUnsignedLong(i32(body, 32));
    int crc = i32(body, 36);
    if (next != offset + count) {
      throw DataPortException.corrupt(address, offset, count + " records from " + offset + " but next offset " + next);
    }
    CRC32C sum = new CRC32C();
    sum.update(body, Frames.PULLED_SIZE, body.length - Frames.PULLED_SIZE);
    if ((int) sum.getValue() != crc) {
      throw DataPortException.corrupt(address, offset, "the reply's CRC32C does not match its bytes");
    }
    if (count == 0) {
      throw DataPortException.unavailable(address + " has nothing at " + offset + " yet");
    }
    data = body;
    size = 0;
    int found = 0;
    int pos = Frames.PULLED_SIZE;
    int n = body.length;
    while (pos < n) {
      int at = pos - Frames.PULLED_SIZE; // the byte within the records, as the Python reader names it
      if (n - pos < HEADER_SIZE) {
        throw DataPortException.corrupt(address, offset, "a record at byte " + at + " is cut short");
      }
      long total = Integer.toUnsignedLong(i32(body, pos));
      int magic = i32(body, pos + 4);
      if (magic != MAGIC) {
        throw DataPortException.corrupt(address, offset, String.format("bad magic 0x%08x at byte %d", magic, at));
      }
      if (total < HEADER_SIZE || pos + total > n) {
        throw DataPortException.corrupt(address, offset, "bad record length " + total + " at byte " + at);
      }
      int topicLen = Short.toUnsignedInt((short) (body[pos + 14] << 8 | (body[pos + 15] & 0xFF)));
      long plen = Integer.toUnsignedLong(i32(body, pos + 56));
      long blen = Integer.toUnsignedLong(i32(body, pos + 60));
      if (HEADER_SIZE + topicLen + plen + blen != total) {
        throw DataPortException.corrupt(address, offset, "length " + total + " does not match its fields at byte " + at);
      }
      if (found < keep) {
        if (i32(body, pos + 16) != queue) {
          throw DataPortException.corrupt(
              address, offset, "a record of queue " + i32(body, pos + 16) + " in a pull of queue " + queue);
        }
        ensure(found + 1);
        offsets[found] = i64(body, pos + 24);
        storeTs[found] = i64(body, pos + 48);
        propsAt[found] = pos + HEADER_SIZE + topicLen;
        propsLen[found] = (int) plen;
        bodyAt[found] = propsAt[found] + (int) plen;
        bodyLen[found] = (int) blen;
        size++;
      }
      found++;
      pos += (int) total;
    }
    if (found != count) {
      throw DataPortException.corrupt(address, offset, found + " records, " + count + " announced");
    }
  }

  private void ensure(int capacity) {
    if (capacity <= offsets.length) {
      return;
    }
    int c = Math.max(capacity, offsets.length * 2);
    offsets = java.util.Arrays.copyOf(offsets, c);
    storeTs = java.util.Arrays.copyOf(storeTs, c);
    propsAt = java.util.Arrays.copyOf(propsAt, c);
    propsLen = java.util.Arrays.copyOf(propsLen, c);
    bodyAt = java.util.Arrays.copyOf(bodyAt, c);
    bodyLen = java.util.Arrays.copyOf(bodyLen, c);
  }
}
