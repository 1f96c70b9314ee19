"""Pulling a round's replies within its deadline over a deployment's HTTP grid
(strategies/exchange.py)."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Iterable
from typing import Any

from clients.flower_internals.releases import HTTP_GRID_MODULE, mismatch
from clients.log import log


@functools.cache
def bounded_reply_pulls_available() -> bool:
    """Whether :func:`pull_replies` may run its own pull: ``HttpGrid.pull_messages`` is a
    checked release's; where it is not, say so once (Flower's pull then runs)."""
    if problem := mismatch(f"{HTTP_GRID_MODULE}:HttpGrid.pull_messages"):
        log.warning(f"replies are pulled by Flower's own code, which waits for a reply's arrays until the "
                    f"SuperLink's object-push session expires, past round-timeout: {problem}")
    return not problem


# A reply's arrays that are not there yet are asked for again after this many seconds,
# doubling up to the cap (Flower's: from 1 s up to 10 s): a pull bounded by a round's
# deadline ends within a fraction of a second of it.
REPLY_PULL_BACKOFF_S, REPLY_PULL_BACKOFF_CAP_S = 0.01, 0.2


def pull_replies(grid: Any, message_ids: Iterable[str], deadline: float) -> tuple[list, set[str]]:
    """``grid.pull_messages(message_ids)``, where a deployment's grid waits for each reply's
    arrays until ``deadline`` (a ``time.monotonic()`` time) at most; with the ids of the
    messages whose replies were left out for it.

    Over HTTP (``HttpGrid``), flwr 1.41.0 and 1.42.0's ``pull_messages`` hands a reply out
    once the SuperNode has sent its metadata, then waits for its arrays until they are all
    there or the SuperLink's object-push session expires (180 s): a SuperNode frozen or cut
    off mid-upload held its round ~3 minutes past round-timeout, and the replies that arrived
    meanwhile stayed unpulled. This is that method with each reply's object pulls bounded by
    ``deadline``: a reply whose arrays are not all there by then is left out (its node did not
    reply in time; the SuperLink hands a reply out once, and asked for it again it answers
    "Message Unavailable", so the caller must not ask). Any other grid, or a release whose
    method differs, runs ``grid.pull_messages``."""
    module = sys.modules.get(HTTP_GRID_MODULE)
    if module is None or not isinstance(grid, module.HttpGrid) or not bounded_reply_pulls_available():
        return list(grid.pull_messages(message_ids)), set()
    import httpx
    from flwr.app import Metadata
    from flwr.app.error import Error
    from flwr.app.message import make_message
    from flwr.common.constant import ErrorCode
    from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest
    from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE
    from flwr.supercore.date import now
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, inflate_object_from_contents, pull_objects

    run_id, client, node = grid._run.run_id, grid._runtime_client, grid.node
    try:
        response = client.PullMessages(PullAppMessagesRequest(message_ids=message_ids))
    except httpx.HTTPStatusError as error:
        if error.response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
            log.error(module.ERROR_MESSAGE_PULL_MESSAGES_PAYLOAD_TOO_LARGE)
            return [], set()
        raise
    replies, left_out = [], set()
    for reply, tree in zip(response.messages_list, response.message_object_trees, strict=True):
        message_id = reply.metadata.message_id
        try:
            contents = pull_objects(
                [subtree.object_id for subtree in iterate_object_tree(tree)],
                make_pull_object_fn_protobuf(pull_object_protobuf=client.PullObject, node=node, run_id=run_id),
                max_time=max(deadline - time.monotonic(), 0.0),
                initial_backoff=REPLY_PULL_BACKOFF_S, backoff_cap=REPLY_PULL_BACKOFF_CAP_S,
            )
        except ObjectPullError as error:
            if time.monotonic() >= deadline:
                left_out.add(reply.metadata.reply_to_message_id)
                continue
            # Flower's reply for arrays the SuperLink no longer holds.
            replies.append(make_message(
                metadata=Metadata(run_id=run_id, message_id="", src_node_id=node.node_id, dst_node_id=node.node_id,
                                  message_type=SYSTEM_MESSAGE_TYPE, group_id="", ttl=0,
                                  reply_to_message_id=reply.metadata.reply_to_message_id,
                                  created_at=now().timestamp()),
                error=Error(code=ErrorCode.MESSAGE_UNAVAILABLE,
                            reason="Reply message objects are unavailable. The sender may not have completed the "
                                   f"upload before the object-push session expired. {error}"),
            ))
            continue
        client.ConfirmMessageReceived(ConfirmMessageReceivedRequest(node=node, run_id=run_id,
                                                                    message_object_id=message_id))
        message = inflate_object_from_contents(message_id, contents)
        message.metadata.__dict__["_message_id"] = message_id
        replies.append(message)
    return replies, left_out
