"""Spec descriptor pools and the method registry.

Each spec gets a descriptor pool of its own (csi_secret and cmi_secret both use field option
number 1059 on google.protobuf.FieldOptions). Everything plugproxy knows about a method (its
spec, message types, streaming kind) is read from these descriptors, and so are the
skeletons :mod:`plugproxy.core.sampling` reads large messages with.

A bundled spec's pool is built the first time something needs it (:func:`load_spec`), and a
lazy registry (``plugproxy serve``'s) lists a bundled spec's methods when the first of them
is looked up: a proxy beside a CSI plugin never builds the pools of the other specs,
while ``--spec auto`` still knows every bundled method.

Besides the bundled specs, each ``--descriptor-set`` file (a binary FileDescriptorSet built
with its imports) becomes a spec of its own (:func:`load_descriptor_set`): every service it
defines is known, in a pool of its own. The spec is named after the proto package of its
services, or after the file when they span several packages.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pkgutil
from collections.abc import Iterable, Iterator

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message

from plugproxy.api import CallKind, MethodInfo, SpecDescriptors, SpecInfo
from plugproxy.core import sampling
from plugproxy.core.endpoints import ConfigError
from plugproxy.spec import keys

# spec name -> (descriptor set file, proto package, secret option full name or None)
SPECS: dict[str, tuple[str, str, str | None]] = {
    "csi.v1": ("csi_v1.binpb", "csi.v1", "csi.v1.csi_secret"),
    "csi.v0": ("csi_v0.binpb", "csi.v0", None),
    "cosi.v1alpha1": ("cosi_v1alpha1.binpb", "cosi.v1alpha1", "cosi.v1alpha1.cosi_secret"),
    # COSI v0.2's API: its package is sigs.k8s.io.cosi.v1alpha2.
    "cosi.v1alpha2": (
        "cosi_v1alpha2.binpb",
        "sigs.k8s.io.cosi.v1alpha2",
        "sigs.k8s.io.cosi.v1alpha2.cosi_secret",
    ),
    "cmi.v1": ("cmi_v1.binpb", "cmi.v1", "cmi.v1.cmi_secret"),
    # Kubernetes' own plugin APIs. Their packages are short ("v2", "v1beta1") or carry no
    # version, so the spec name is never taken for the package.
    "kms.v2": ("kms_v2.binpb", "v2", None),
    "deviceplugin.v1beta1": ("deviceplugin_v1beta1.binpb", "v1beta1", None),
    "dra.v1beta1": ("dra_v1beta1.binpb", "k8s.io.kubelet.pkg.apis.dra.v1beta1", None),
    "dra.v1": ("dra_v1.binpb", "k8s.io.kubelet.pkg.apis.dra.v1", None),
    # DRA device health: packages "v1alpha1" and "v1", served beside DRAPlugin.
    "drahealth.v1alpha1": ("drahealth_v1alpha1.binpb", "v1alpha1", None),
    "drahealth.v1": ("drahealth_v1.binpb", "v1", None),
    "pluginregistration.v1": ("pluginregistration_v1.binpb", "pluginregistration", None),
}
SPEC_NAMES: tuple[str, ...] = tuple(SPECS)
# Other names --spec accepts for a bundled spec.
SPEC_ALIASES: dict[str, str] = {
    "kms": "kms.v2",
    "device-plugin": "deviceplugin.v1beta1",
    "dra": "dra.v1",  # kubelet asks for v1 first
    "dra-health": "drahealth.v1",
    "plugin-registration": "pluginregistration.v1",
}


def canonical_spec(name: str) -> str:
    """The spec name for ``name`` or one of its aliases; ValueError when unknown."""
    spec = SPEC_ALIASES.get(name, name)
    if spec not in SPECS:
        known = ", ".join((*SPEC_NAMES, *SPEC_ALIASES))
        raise ValueError(f"unknown spec {name!r}; known: {known}")
    return spec


def spec_package(name: str) -> str:
    """The proto package of spec ``name`` (every message and service lives under it)."""
    return SPECS[name][1]


def _walk(desc: Descriptor) -> Iterator[Descriptor]:
    yield desc
    for nested in desc.nested_types:
        yield from _walk(nested)


@functools.cache
def load_spec(name: str) -> SpecInfo:
    """Bundled spec ``name``; its descriptor set is read into a fresh pool the first time
    anything asks for its descriptors. Cached: one per process, pools are immutable."""
    if name not in SPECS:
        raise ValueError(f"unknown spec {name!r}; known: {', '.join(SPEC_NAMES)}")
    return SpecInfo(name, name.split(".", 1)[0], load=functools.partial(read_spec, name))


def _spec_set(name: str) -> bytes:
    # pkgutil rather than importlib.resources: the latter imports zipfile and pathlib, a
    # few hundred KiB of resident memory for reading eight small package files.
    data = pkgutil.get_data("plugproxy.descriptors", SPECS[name][0])
    assert data is not None
    return data


def read_spec(name: str) -> SpecDescriptors:
    """Bundled spec ``name``'s descriptor set, read into a fresh pool."""
    _, package, secret_name = SPECS[name]
    fds = descriptor_pb2.FileDescriptorSet.FromString(_spec_set(name))
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
    return SpecDescriptors(pool, secret, options_class, classes)


@functools.cache
def declared_paths(name: str) -> frozenset[str]:
    """Every method path bundled spec ``name`` defines, read without building its pool."""
    package = SPECS[name][1]
    fds = descriptor_pb2.FileDescriptorSet.FromString(_spec_set(name))
    return frozenset(
        f"/{package}.{service.name}/{method.name}"
        for fdp in fds.file
        if fdp.package == package
        for service in fdp.service
        for method in service.method
    )


def _set_files(where: str, data: bytes) -> list[descriptor_pb2.FileDescriptorProto]:
    """The files of a serialized FileDescriptorSet, imports before their importers;
    ConfigError unless every file it imports is in it."""
    try:
        fds = descriptor_pb2.FileDescriptorSet.FromString(data)
    except DecodeError:
        fds = None
    if fds is None or not fds.file or not all(f.name for f in fds.file):
        raise ConfigError(
            f"{where}: not a binary FileDescriptorSet "
            "(build it with protoc --include_imports --descriptor_set_out, or buf build -o)"
        )
    by_name = {f.name: f for f in fds.file}
    for f in fds.file:
        for dep in f.dependency:
            if dep not in by_name:
                raise ConfigError(
                    f"{where}: {f.name} imports {dep}, which the set does not contain "
                    "(build it with protoc --include_imports)"
                )
    ordered: list[descriptor_pb2.FileDescriptorProto] = []
    placed: set[str] = set()

    def place(f: descriptor_pb2.FileDescriptorProto, seen: frozenset[str]) -> None:
        if f.name in placed:
            return
        if f.name in seen:
            raise ConfigError(f"{where}: {f.name} imports itself through {', '.join(sorted(seen))}")
        for dep in f.dependency:
            place(by_name[dep], seen | {f.name})
        placed.add(f.name)
        ordered.append(f)

    for f in fds.file:
        place(f, frozenset())
    return ordered


def load_descriptor_set(path: str, source: str = "--descriptor-set") -> SpecInfo:
    """One descriptor set file as a spec of its own (see the module docstring); ConfigError
    in one line, naming ``source`` and the file, when it cannot be one."""
    where = f"{source} {path}"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    files = _set_files(where, data)
    pool = descriptor_pool.DescriptorPool()
    loaded: list[FileDescriptor] = []
    for fdp in files:
        try:
            pool.Add(fdp)
            loaded.append(pool.FindFileByName(fdp.name))
        except Exception as exc:  # the pool's own words on what does not resolve
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"{where}: {fdp.name} does not load: {reason}") from None
    packages = sorted({fd.package for fd in loaded if fd.services_by_name})
    if not packages:
        raise ConfigError(f"{where}: defines no service")
    stem = os.path.splitext(os.path.basename(path))[0]
    name = packages[0] if len(packages) == 1 and packages[0] else stem
    classes: dict[str, type[Message]] = {}
    for fd in loaded:
        for top in fd.message_types_by_name.values():
            for desc in _walk(top):
                classes[desc.full_name] = message_factory.GetMessageClass(desc)
    try:
        options_desc = pool.FindMessageTypeByName("google.protobuf.FieldOptions")
    except KeyError:
        options_desc = None  # no file of the set imports descriptor.proto: no custom options
    return SpecInfo(
        name=name,
        family=name,
        pool=pool,
        secret_option=None,
        field_options_class=(
            message_factory.GetMessageClass(options_desc) if options_desc is not None else None
        ),
        message_classes=classes,
        source=path,
        files=tuple(fd.name for fd in loaded),
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
    """Maps full method paths to :class:`MethodInfo`; unknown paths map to raw bidi streams.

    ``descriptor_sets``: files whose services are known besides the bundled ``specs``;
    ``serialize_keys``: ``/pkg.Service/Method=FIELD_PATH`` items (:mod:`plugproxy.spec.keys`).
    Misconfiguration of either is a ConfigError naming ``sources`` (flag or environment
    variable, by option: "--descriptor-set", "--serialize-key").

    ``lazy``: a bundled spec's methods are listed (and its pool built) when one of them is
    first looked up, or named by a ``--serialize-key`` or :meth:`methods`; until then
    :meth:`methods` leaves them out, while :meth:`lookup` and ``in`` know them all.
    """

    def __init__(
        self,
        specs: Iterable[str] = SPEC_NAMES,
        descriptor_sets: Iterable[str] = (),
        serialize_keys: Iterable[str] = (),
        sources: dict[str, str] | None = None,
        *,
        lazy: bool = False,
    ) -> None:
        named = sources or {}
        self.specs: dict[str, SpecInfo] = {}
        self._methods: dict[str, MethodInfo] = {}
        # proto package -> the bundled spec of that package whose methods are not listed yet
        self._unlisted: dict[str, str] = {}
        for spec_name in specs:
            self.specs[spec_name] = load_spec(spec_name)
            self._unlisted[spec_package(spec_name)] = spec_name
            if not lazy:
                self._list(spec_name)
        set_flag = named.get("--descriptor-set", "--descriptor-set")
        for path in descriptor_sets:
            spec = load_descriptor_set(path, set_flag)
            files = [spec.pool.FindFileByName(n) for n in spec.files]
            for fd in files:
                for service in fd.services_by_name.values():
                    for m in service.methods:
                        method_path = f"/{service.full_name}/{m.name}"
                        if method_path in self:
                            raise ConfigError(
                                f"{set_flag} {path}: {method_path} is already"
                                f" defined by {_origin(self._owner(method_path))}"
                            )
            if spec.name in SPECS or spec.name in self.specs:
                raise ConfigError(
                    f"{set_flag} {path}: its spec name {spec.name} is already taken by"
                    f" {_origin(self.specs.get(spec.name))}"
                )
            self.specs[spec.name] = spec
            self._add_services(spec, files)
        key_flag = named.get("--serialize-key", "--serialize-key")
        for item in serialize_keys:
            self._add_serialize_key(item, key_flag)

    def _list(self, spec_name: str) -> None:
        """List the methods of bundled spec ``spec_name`` (building its pool)."""
        package = spec_package(spec_name)
        if self._unlisted.pop(package, None) is None:
            return
        spec = self.specs[spec_name]
        files = [spec.pool.FindFileByName(n) for n in self._spec_files(spec, package)]
        self._add_services(spec, files)

    def _unlisted_spec(self, path: str) -> str | None:
        """The bundled spec not listed yet whose package ``path``'s service is in."""
        if not self._unlisted:
            return None
        service, _ = split_path(path)
        return self._unlisted.get(service.rpartition(".")[0])

    def _owner(self, path: str) -> SpecInfo | None:
        info = self._methods.get(path)
        if info is not None:
            return info.spec
        unlisted = self._unlisted_spec(path)
        return self.specs[unlisted] if unlisted is not None else None

    def _add_serialize_key(self, item: str, flag: str) -> None:
        try:
            method_path, field_path = keys.parse_serialize_key(item)
        except ValueError as exc:
            raise ConfigError(f"{flag} {item}: {exc}") from None
        info = self.lookup(method_path)
        if not info.known:
            raise ConfigError(
                f"{flag} {item}: unknown method {method_path} (not in a served spec or"
                " descriptor set)"
            )
        try:
            keys.check_key_path(info, field_path)
        except ValueError as exc:
            raise ConfigError(f"{flag} {item}: {exc}") from None
        key = (field_path, field_path)
        if key not in info.extra_keys:
            self._methods[method_path] = dataclasses.replace(
                info, extra_keys=(*info.extra_keys, key)
            )

    def _add_services(self, spec: SpecInfo, files: Iterable[FileDescriptor]) -> None:
        for fd in files:
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
        unlisted = self._unlisted_spec(path)
        if unlisted is not None and path in declared_paths(unlisted):
            self._list(unlisted)
            return self._methods[path]
        service, name = split_path(path)
        # Unknown methods: the wire framing of every call type is the same, so a raw
        # bidirectional relay carries unary and streaming calls alike.
        return MethodInfo(path=path, service=service, name=name, kind=CallKind.STREAM_STREAM)

    def methods(self, spec: str | None = None) -> list[MethodInfo]:
        """The methods of ``spec`` (listing them now if need be), or of every spec listed
        so far."""
        if spec is not None and spec in self.specs and self.specs[spec].bundled:
            self._list(spec)
        return [m for m in self._methods.values() if spec is None or m.spec_name == spec]

    def __contains__(self, path: str) -> bool:
        """Whether ``path`` is a method of a served spec (lists nothing, builds no pool)."""
        if path in self._methods:
            return True
        unlisted = self._unlisted_spec(path)
        return unlisted is not None and path in declared_paths(unlisted)


def _origin(spec: SpecInfo | None) -> str:
    if spec is None:
        return "a bundled spec"
    if spec.source is None:
        return f"the bundled spec {spec.name}"
    return f"--descriptor-set {spec.source} (spec {spec.name})"
