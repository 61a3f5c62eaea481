package io.tidelog.spark;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;

/**
 * One plain TCP connection to a broker's data port, used by one task's thread: requests go out
 * with ids of their own, and replies are read whole, one frame at a time (a reply may overtake an
 * earlier one; {@link PullPipeline} matches them by id). Every failure is a {@link
 * DataPortException} naming the address; after one the connection is closed and not used again.
 */
final class DataPortConnection implements Closeable {
  static final int CONNECT_TIMEOUT_MS = 3000;

  /** One reply frame: its status, request id and body. */
  static final class Frame {
    final int status;
    final int rid;
    final byte[] body;

    Frame(int status, int rid, byte[] body) {
      this.status = status;
      this.rid = rid;
      this.body = body;
    }
  }

  final String address;
  private final Socket socket;
  private final DataInputStream in;
  private final OutputStream out;
  private int nextId = 1;
  private boolean broken;

  private DataPortConnection(String address, Socket socket) throws IOException {
    this.address = address;
    this.socket = socket;
    this.in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 64 << 10));
    this.out = socket.getOutputStream();
  }

  static DataPortConnection open(String address, long timeoutMs) throws DataPortException {
    Address a = Address.parse(address);
    Socket s = new Socket();
    try {
      s.setTcpNoDelay(true);
      s.setReceiveBufferSize(4 << 20);
      s.connect(new InetSocketAddress(a.host, a.port), (int) Math.max(1, Math.min(CONNECT_TIMEOUT_MS, timeoutMs)));
      return new DataPortConnection(address, s);
    } catch (IOException e) {
      closeQuietly(s);
      throw new DataPortException("cannot reach the data port " + address + ": " + e, e);
    }
  }

  boolean usable() {
    return !broken;
  }

  /** Sends a pull; returns its request id. */
  int sendPull(String topic, int queue, long offset, int maxMessages, int waitMs) throws DataPortException {
    int rid = nextId++;
    if (nextId < 0) {
      nextId = 1; // ids are u32 on the wire; these stay positive
    }
    byte[] frame =
        Frames.pullRequest(rid, topic, queue, offset, maxMessages, ReadSettings.PULL_MAX_BYTES, waitMs);
    try {
      out.write(frame);
      out.flush();
    } catch (IOException e) {
      broken = true;
      throw new DataPortException("the data connection to " + address + " was lost: " + e, e);
    }
    return rid;
  }

  /** The next reply frame, waiting at most {@code timeoutMs} for it to start arriving. */
  Frame read(long timeoutMs) throws DataPortException {
    try {
      socket.setSoTimeout((int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs)));
      long length = Integer.toUnsignedLong(in.readInt());
      int status = in.readUnsignedByte();
      int rid = in.readInt();
      byte[] body = new byte[Frames.bodyLength(length, address)];
      in.readFully(body);
      return new Frame(status, rid, body);
    } catch (SocketTimeoutException e) {
      broken = true;
      throw DataPortException.unavailable(
          "no answer from the data port " + address + " within " + timeoutMs + " ms");
    } catch (DataPortException e) {
      broken = true;
      throw e;
    } catch (IOException e) {
      broken = true;
      throw new DataPortException("the data connection to " + address + " was lost: " + e, e);
    }
  }

  @Override
  public void close() {
    broken = true;
    closeQuietly(socket);
  }

  private static void closeQuietly(Socket s) {
    try {
      s.close();
    } catch (IOException ignored) {
      // closing a socket that failed: nothing more to learn from it
    }
  }
}
