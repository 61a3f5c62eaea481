package io.tidelog.spark;

import java.util.Arrays;
import org.apache.spark.sql.connector.read.InputPartition;

/** One Spark task's work: offsets {@code [start, end)} of one queue, and the data ports to read them from. */
final class RangePartition implements InputPartition {
  private static final long serialVersionUID = 1L;

  final String topic;
  final String brokerSet;
  final int queue;
  final long start;
  final long end;
  /** The start is "whatever retention kept": skipping ahead is not data loss. */
  final boolean earliest;
  /** Data-port addresses (host:port) of the broker set's replicas, slaves first, as planned. */
  final String[] replicas;

  RangePartition(
      String topic, String brokerSet, int queue, long start, long end, boolean earliest, String[] replicas) {
    this.topic = topic;
    this.brokerSet = brokerSet;
    this.queue = queue;
    this.start = start;
    this.end = end;
    this.earliest = earliest;
    this.replicas = replicas;
  }

  /** "topic broker-a:0", as the Python reader names a queue in its messages. */
  String where() {
    return topic + " " + brokerSet + ":" + queue;
  }

  @Override
  public String toString() {
    return where() + " [" + start + ", " + end + ") from " + Arrays.toString(replicas);
  }
}
