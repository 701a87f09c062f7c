"""Spec descriptor pools and the method registry.

Each spec gets a descriptor pool of its own (csi_secret and cmi_secret both use field option
number 1059 on google.protobuf.FieldOptions). Everything plugproxy knows about a method (its
spec, message types, streaming kind) is read from these descriptors at startup, and so are
the skeletons :mod:`plugproxy.sampling` reads large messages with.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Iterable, Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from plugproxy import sampling
from plugproxy.api import CallKind, MethodInfo, SpecInfo

# spec name -> (descriptor set file, proto package, secret option full name or None)
SPECS: dict[str, tuple[str, str, str | None]] = {
    "csi.v1": ("csi_v1.binpb", "csi.v1", "csi.v1.csi_secret"),
    "csi.v0": ("csi_v0.binpb", "csi.v0", None),
    "cosi.v1alpha1": ("cosi_v1alpha1.binpb", "cosi.v1alpha1", "cosi.v1alpha1.cosi_secret"),
    "cmi.v1": ("cmi_v1.binpb", "cmi.v1", "cmi.v1.cmi_secret"),
}
SPEC_NAMES: tuple[str, ...] = tuple(SPECS)


def _walk(desc: Descriptor) -> Iterator[Descriptor]:
    yield desc
    for nested in desc.nested_types:
        yield from _walk(nested)


@functools.cache
def load_spec(name: str) -> SpecInfo:
    """Load one spec's descriptor set into a fresh pool. Cached: pools are immutable."""
    if name not in SPECS:
        raise ValueError(f"unknown spec {name!r}; known: {', '.join(SPEC_NAMES)}")
    filename, package, secret_name = SPECS[name]
    data = importlib.resources.files("plugproxy.descriptors").joinpath(filename).read_bytes()
    fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for fdp in fds.file:
        pool.Add(fdp)
    classes: dict[str, type[Message]] = {}
    for fdp in fds.file:
        if fdp.package != package:
            continue
        fd = pool.FindFileByName(fdp.name)
        for top in fd.message_types_by_name.values():
            for desc in _walk(top):
                classes[desc.full_name] = message_factory.GetMessageClass(desc)
    secret = pool.FindExtensionByName(secret_name) if secret_name else None
    options_class = (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("google.protobuf.FieldOptions"))
        if secret is not None
        else None
    )
    return SpecInfo(
        name=name,
        family=name.split(".", 1)[0],
        pool=pool,
        secret_option=secret,
        field_options_class=options_class,
        message_classes=classes,
    )


def _kind(client_streaming: bool, server_streaming: bool) -> CallKind:
    if client_streaming:
        return CallKind.STREAM_STREAM if server_streaming else CallKind.STREAM_UNARY
    return CallKind.UNARY_STREAM if server_streaming else CallKind.UNARY_UNARY


def split_path(path: str) -> tuple[str, str]:
    """'/pkg.Service/Method' -> ('pkg.Service', 'Method'); tolerant of odd paths."""
    service, _, name = path.lstrip("/").rpartition("/")
    return service, name


class Registry:
    """Maps full method paths to :class:`MethodInfo`; unknown paths map to raw bidi streams."""

    def __init__(self, specs: Iterable[str] = SPEC_NAMES) -> None:
        self.specs: dict[str, SpecInfo] = {}
        self._methods: dict[str, MethodInfo] = {}
        for spec_name in specs:
            spec = load_spec(spec_name)
            self.specs[spec_name] = spec
            _, package, _ = SPECS[spec_name]
            for fdp_name in self._spec_files(spec, package):
                fd = spec.pool.FindFileByName(fdp_name)
                for service in fd.services_by_name.values():
                    for m in service.methods:
                        path = f"/{service.full_name}/{m.name}"
                        request_class = spec.message_class(m.input_type.full_name)
                        response_class = spec.message_class(m.output_type.full_name)
                        sampling.prepare(request_class)
                        sampling.prepare(response_class)
                        self._methods[path] = MethodInfo(
                            path=path,
                            service=service.full_name,
                            name=m.name,
                            kind=_kind(m.client_streaming, m.server_streaming),
                            spec=spec,
                            descriptor=m,
                            request_class=request_class,
                            response_class=response_class,
                        )

    @staticmethod
    def _spec_files(spec: SpecInfo, package: str) -> list[str]:
        filename = SPECS[spec.name][0].replace(".binpb", ".proto")
        fd = spec.pool.FindFileByName(filename)
        assert fd.package == package
        return [filename]

    def lookup(self, path: str) -> MethodInfo:
        info = self._methods.get(path)
        if info is not None:
            return info
        service, name = split_path(path)
        # Unknown methods: the wire framing of every call type is the same, so a raw
        # bidirectional relay carries unary and streaming calls alike.
        return MethodInfo(path=path, service=service, name=name, kind=CallKind.STREAM_STREAM)

    def methods(self, spec: str | None = None) -> list[MethodInfo]:
        return [m for m in self._methods.values() if spec is None or m.spec_name == spec]

    def __contains__(self, path: str) -> bool:
        return path in self._methods
