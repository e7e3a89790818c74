"""Read the scalars of a run's TensorBoard event files (tensorboardX's format) without TensorBoard."""
import os
import struct
from typing import Dict, List, Tuple


def read_scalars(folder: str) -> Dict[str, List[Tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` as TensorBoard shows the scalars of the event files in ``folder``.

    The files (TFRecord framing: uint64 length, its CRC, an ``Event`` proto, its CRC) are read in name
    (= creation) order; a ``SessionLog.START`` event at step P, which a writer made with ``purge_step=P``
    writes first, hides every point read before it whose step is >= P (TensorBoard's rule for event
    files of version 2). A record cut short by a kill ends its file.

    Raises:
        FileNotFoundError: ``folder`` holds no ``*.tfevents.*`` file.
    """
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    names = sorted(n for n in os.listdir(folder) if ".tfevents." in n) if os.path.isdir(folder) else []
    if not names:
        raise FileNotFoundError("no TensorBoard event file (*.tfevents.*) in {}".format(folder))
    points = {}
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            if pos + 16 + length > len(data):
                break
            event = Event.FromString(data[pos + 12:pos + 12 + length])
            pos += 16 + length
            if event.HasField("session_log") and event.session_log.status == SessionLog.START:
                points = {tag: [(s, v) for s, v in pts if s < event.step] for tag, pts in points.items()}
            for value in event.summary.value:
                points.setdefault(value.tag, []).append((event.step, value.simple_value))
    return points
