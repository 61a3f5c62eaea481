package io.tidelog.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

/**
 * The data port's frames (tidelog/dataport_frames.py), the parts this reader needs: a PULL request, its
 * reply's fields, and an error reply's code and message. Big-endian, as on the wire.
 *
 * <pre>
 * request = length u32 | op u8     | request id u32 | body   (length counts op onward)
 * reply   = length u32 | status u8 | request id u32 | body   (status 0 ok, 1 error)
 * PULL body: topic_len u16 | queue u32 | offset u64 | max_messages u32 | max_bytes u32 | wait_ms u32 | topic
 *      ok:   next offset u64 | min u64 | max u64 | confirmed u64 | count u32 | crc u32 | records
 * error body: code_len u16 | leader_len u16 | code | leader | message
 * </pre>
 */
final class Frames {
  static final int OP_PULL = 2;
  static final int OK = 0;
  static final int HEAD_SIZE = 9;
  /** dataport_frames.MAX_FRAME: the largest frame a broker sends. */
  static final int MAX_FRAME = (64 << 20) + 4096;
  /** The fields of a pull reply before its records. */
  static final int PULLED_SIZE = 40;

  private Frames() {}

  static byte[] pullRequest(int rid, String topic, int queue, long offset, int maxMessages, int maxBytes, int waitMs) {
    byte[] t = topic.getBytes(StandardCharsets.UTF_8);
    int body = 2 + 4 + 8 + 4 + 4 + 4 + t.length;
    ByteBuffer b = ByteBuffer.allocate(HEAD_SIZE + body);
    b.putInt(HEAD_SIZE - 4 + body).put((byte) OP_PULL).putInt(rid);
    b.putShort((short) t.length).putInt(queue).putLong(offset).putInt(maxMessages).putInt(maxBytes).putInt(waitMs);
    b.put(t);
    return b.array();
  }

  /** The body's length from a frame's length field; a value outside the layout breaks the connection. */
  static int bodyLength(long length, String address) throws DataPortException {
    if (length < HEAD_SIZE - 4 || length > MAX_FRAME) {
      throw DataPortException.unavailable(
          "the data port " + address + " sent a frame of length " + length + ", outside 5.." + MAX_FRAME);
    }
    return (int) length - (HEAD_SIZE - 4);
  }

  /** An error reply as the typed failure it stands for (the replica named). */
  static DataPortException error(byte[] body, String address) {
    if (body.length < 4) {
      return DataPortException.unavailable("the data port " + address + " sent a short error reply");
    }
    ByteBuffer b = ByteBuffer.wrap(body);
    int clen = Short.toUnsignedInt(b.getShort());
    int llen = Short.toUnsignedInt(b.getShort());
    if (4 + clen + llen > body.length) {
      return DataPortException.unavailable("the data port " + address + " sent a malformed error reply");
    }
    String code = new String(body, 4, clen, StandardCharsets.UTF_8);
    String message = new String(body, 4 + clen + llen, body.length - 4 - clen - llen, StandardCharsets.UTF_8);
    return new DataPortException(
        code, code + " from " + address + ": " + message, DataPortException.isReplicaCode(code));
  }
}
