"""The controller keeps heartbeat topic lists and the cluster view's topics as serialized field
bytes (`controller/service.py::field_bytes`): merged into a reply they must give exactly the
message the list of topic messages gives."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.controller.service import field_bytes
from tidelog.proto import controller_pb2 as pb

_topics = st.lists(
    st.builds(
        pb.TopicConfig,
        name=st.text(min_size=1, max_size=12),
        queues=st.dictionaries(st.text(min_size=1, max_size=8), st.integers(1, 1024), max_size=3),
        perm=st.sampled_from(["rw", "r", "w"]),
        generation=st.integers(0, 2**40),
        retention_ms=st.integers(0, 2**40),
    ),
    max_size=20,
)


@given(_topics, _topics)
def test_merged_field_bytes_equal_the_lists(
    topics: list[pb.TopicConfig], deleted: list[pb.TopicConfig]
) -> None:
    reply = pb.HeartbeatReply(topics_version="v", topics_unchanged=False)
    reply.MergeFromString(
        field_bytes(pb.HeartbeatReply, "topics", topics)
        + field_bytes(pb.HeartbeatReply, "deleted_topics", deleted)
    )
    assert reply == pb.HeartbeatReply(
        topics=topics, deleted_topics=deleted, topics_version="v", topics_unchanged=False
    )
    assert list(reply.topics) == topics and list(reply.deleted_topics) == deleted


@given(_topics)
def test_the_cluster_views_topics_round_trip(topics: list[pb.TopicConfig]) -> None:
    view = pb.ClusterView(version=7)
    view.MergeFromString(field_bytes(pb.ClusterView, "topics", topics))
    assert list(view.topics) == topics and view.version == 7
