"""``tf.train.Example`` in protobuf wire format, encoded and parsed here, without TensorFlow.

:func:`encode_example` writes deterministic bytes; :func:`parse_example` and :func:`example_class`
parse with protobuf's C parser, through message classes built here.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["FeatureValue", "Floats", "encode_example", "parse_example", "example_class"]

#: What a feature holds: one bytes value or int, or a list of bytes, ints or floats (an empty list is
#: written as an empty int64 list).
FeatureValue = bytes | int | Sequence[bytes] | Sequence[int] | Sequence[float]

_U64 = (1 << 64) - 1


class Floats(tuple):
    """Values written as a float list, also when there are none (an empty plain list is written
    as an int64 list): a feature that readers parse as floats whatever its length."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _feature(value: FeatureValue) -> bytes:
    """Serialised ``Feature`` message for one value."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _field(b"\x0a", _field(b"\x0a", bytes(value)))
    if isinstance(value, int):
        return _field(b"\x1a", _field(b"\x0a", _varint(value & _U64)))
    values = list(value)
    if not values:  # no type to go by: an empty int64 list (the type of every list packer writes empty, labels)
        return _field(b"\x12" if isinstance(value, Floats) else b"\x1a", b"")
    if all(isinstance(v, (bytes, bytearray, memoryview)) for v in values):
        return _field(b"\x0a", b"".join(_field(b"\x0a", bytes(v)) for v in values))  # type: ignore[arg-type]
    if all(isinstance(v, int) for v in values):
        packed = b"".join(_varint(int(v) & _U64) for v in values)
        return _field(b"\x1a", _field(b"\x0a", packed) if packed else b"")
    if all(isinstance(v, (int, float)) for v in values):
        packed = struct.pack(f"<{len(values)}f", *values)
        return _field(b"\x12", _field(b"\x0a", packed) if packed else b"")
    raise TypeError(f"feature values must be bytes, ints or floats, not {[type(v).__name__ for v in values]}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialise a ``tf.train.Example`` with ``features`` (name -> value).

    Deterministic: map entries in sorted key order (UTF-8 byte order), every entry with its key and
    value, lists packed. These are exactly the bytes protobuf's
    ``SerializeToString(deterministic=True)`` gives for the same Example (a test checks it against
    the generated protos shipped with the ``tfrecord`` package).
    """
    items = sorted((k.encode("utf-8"), v) for k, v in features.items())
    entries = b"".join(_field(b"\x0a", _field(b"\x0a", k) + _field(b"\x12", _feature(v))) for k, v in items)
    return _field(b"\x0a", entries)


def _message_classes() -> dict[str, type]:
    """Message classes for these protos (tensorflow/core/example/{example,feature}.proto), built
    from a descriptor in a private pool::

        Example   { Features features = 1; }
        Features  { map<string, Feature> feature = 1; }          // entry: key = 1, value = 2
        Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                 Int64List int64_list = 3; } }
        BytesList { repeated bytes value = 1; }
        FloatList { repeated float value = 1 [packed = true]; }
        Int64List { repeated int64 value = 1 [packed = true]; }

    Parsing then runs in protobuf's C parser (upb), several times faster than a walk over the wire
    format in Python (docs/benchmarks.md). No generated ``_pb2`` module is involved, so a protobuf
    runtime upgrade cannot break us on a gencode version check, and we never clash with
    TensorFlow's own registration of the names.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="packer/tf_example.proto", package="tensorflow", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL

    def message(name: str, *fields: tuple[str, int, int, int, str], parent=None):
        m = (parent.nested_type if parent is not None else fdp.message_type).add(name=name)
        for fname, number, label, ftype, type_name in fields:
            f = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                f.type_name = type_name
        return m

    message("BytesList", ("value", 1, rep, F.TYPE_BYTES, ""))
    message("FloatList", ("value", 1, rep, F.TYPE_FLOAT, "")).field[0].options.packed = True
    message("Int64List", ("value", 1, rep, F.TYPE_INT64, "")).field[0].options.packed = True
    feature = message(
        "Feature",
        ("bytes_list", 1, opt, F.TYPE_MESSAGE, ".tensorflow.BytesList"),
        ("float_list", 2, opt, F.TYPE_MESSAGE, ".tensorflow.FloatList"),
        ("int64_list", 3, opt, F.TYPE_MESSAGE, ".tensorflow.Int64List"),
    )
    feature.oneof_decl.add(name="kind")
    for f in feature.field:
        f.oneof_index = 0
    features = message("Features", ("feature", 1, rep, F.TYPE_MESSAGE, ".tensorflow.Features.FeatureEntry"))
    entry = message(
        "FeatureEntry",
        ("key", 1, opt, F.TYPE_STRING, ""),
        ("value", 2, opt, F.TYPE_MESSAGE, ".tensorflow.Feature"),
        parent=features,
    )
    entry.options.map_entry = True
    message("Example", ("features", 1, opt, F.TYPE_MESSAGE, ".tensorflow.Features"))

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    get = getattr(message_factory, "GetMessageClass", None)
    if get is None:  # protobuf < 4.22
        factory = message_factory.MessageFactory(pool)
        get = factory.GetPrototype
    return {n: get(pool.FindMessageTypeByName(f"tensorflow.{n}")) for n in ("Example", "Feature", "Features")}


_CLASSES: dict[str, type] = {}


def example_class() -> type:
    """The ``tensorflow.Example`` message class (protobuf's C parser; built once per process)."""
    if not _CLASSES:
        _CLASSES.update(_message_classes())
    return _CLASSES["Example"]


def parse_example(data: bytes | bytearray | memoryview) -> Any:
    """Parse a serialised ``tf.train.Example``; returns the protobuf message.

    Use ``msg.features.feature[name].bytes_list.value`` / ``.int64_list.value``. Any valid
    encoding is accepted (unsorted or repeated entries, packed or unpacked numbers, unknown
    fields). Raises ValueError on malformed input (protobuf's DecodeError is one).
    """
    from google.protobuf.message import DecodeError

    msg = example_class()()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise ValueError(f"not a valid tf.train.Example ({e})") from None
    return msg
