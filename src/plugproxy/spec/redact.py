"""Redaction: the one way any message content leaves plugproxy (logs, reports, spans, errors).

A field is sensitive when

- its descriptor carries the spec's secret option (``csi_secret``, ``cosi_secret``,
  ``cmi_secret``), resolved by the extension's full name in that spec's own pool, or
  protobuf's own ``debug_redact`` field option, in any spec or ``--descriptor-set``
  (:meth:`plugproxy.api.SpecInfo.is_secret_field`);
- it is one of the fields a spec names as secret without an option: the ``*_secrets`` maps of
  CSI v0.3 (CSI v0.3 §Secrets Requirements) and the credentials a COSI plugin hands out
  (COSI v1alpha1 and v1alpha2 §DriverGrantBucketAccess, where v1alpha2 tags none);
- it is one of the fields whose value opens everything else though no spec says "secret":
  the plaintext of KMS v2 Encrypt and Decrypt (a data encryption key);
- it is one the spec calls possibly sensitive (CSI §NodePublishVolume ``mount_flags``) or that
  carries tokens in practice (NodePublishVolume ``volume_context``, KMS v2 annotations,
  device plugin ``envs``), unless ``--redact-defaults off``;
- or an operator names it with ``--redact <message full name>.<field>`` (a message of a
  bundled spec or of a served descriptor set).

A :class:`Plan` is computed per message type, for each spec as soon as its descriptors are
read (at startup, or when a proxy's first call of the spec loads them): which fields to
mask, and which message-typed fields lead (at any depth, through repeated fields, map values
and oneofs) to something sensitive. A type with nothing sensitive reachable has no plan and
is rendered without a single redaction check.

Masking: a map keeps its keys (they name the secret) and every value becomes ``***``
(message values keep their structure, every leaf masked); any other sensitive field, scalar,
bytes, repeated or message, becomes ``***`` as a whole.

:meth:`Redactor.render` turns a message into a JSON-ready dict (proto field names, like
protobuf's MessageToDict), optionally capped at a byte budget: rendering stops where the
budget runs out and says so under :data:`TRUNCATED_KEY`, so a 10,000-entry list costs no
more than the part that is shown. :meth:`Redactor.mask_text` masks, in free text such as a
plugin's error message, every secret value the call's request carried.
"""

from __future__ import annotations

import base64
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from plugproxy.api import Call, SpecInfo
from plugproxy.core.endpoints import ConfigError
from plugproxy.core.memory import remember
from plugproxy.core.options import Option, options_of, setting
from plugproxy.core.sampling import Sample
from plugproxy.spec.registry import SPEC_NAMES, load_spec, spec_package

MASK = "***"
TRUNCATED_KEY = "…truncated"
MIN_TEXT_SECRET = 4
"""Secret values shorter than this are not searched for in free text (they would mask
ordinary words); the fields holding them are always masked."""

# Named by the specs as secret, though no field option says so.
SPEC_SECRET_PATHS: dict[str, tuple[str, ...]] = {
    # CSI v0.3 §Secrets Requirements: the per-RPC `*_secrets` maps.
    "csi.v0": (
        "csi.v0.CreateVolumeRequest.controller_create_secrets",
        "csi.v0.DeleteVolumeRequest.controller_delete_secrets",
        "csi.v0.ControllerPublishVolumeRequest.controller_publish_secrets",
        "csi.v0.ControllerUnpublishVolumeRequest.controller_unpublish_secrets",
        "csi.v0.CreateSnapshotRequest.create_snapshot_secrets",
        "csi.v0.DeleteSnapshotRequest.delete_snapshot_secrets",
        "csi.v0.NodeStageVolumeRequest.node_stage_secrets",
        "csi.v0.NodePublishVolumeRequest.node_publish_secrets",
    ),
    # COSI v1alpha1 §DriverGrantBucketAccess: the access credentials the plugin returns.
    "cosi.v1alpha1": (
        "cosi.v1alpha1.DriverGrantBucketAccessResponse.credentials",
        "cosi.v1alpha1.CredentialDetails.secrets",
    ),
    # COSI v1alpha2 tags no field cosi_secret. Masked: every credential of a grant, per
    # protocol (keys, secrets, SAS tokens, the GCS key and account names; the expiry stays
    # shown), and each bucket's info in a grant, which §DriverGrantBucketAccess says COSI
    # treats as secret.
    "cosi.v1alpha2": (
        "sigs.k8s.io.cosi.v1alpha2.S3CredentialInfo.access_key_id",
        "sigs.k8s.io.cosi.v1alpha2.S3CredentialInfo.access_secret_key",
        "sigs.k8s.io.cosi.v1alpha2.AzureCredentialInfo.access_token",
        "sigs.k8s.io.cosi.v1alpha2.GcsCredentialInfo.access_id",
        "sigs.k8s.io.cosi.v1alpha2.GcsCredentialInfo.access_secret",
        "sigs.k8s.io.cosi.v1alpha2.GcsCredentialInfo.private_key_name",
        "sigs.k8s.io.cosi.v1alpha2.GcsCredentialInfo.service_account",
        "sigs.k8s.io.cosi.v1alpha2.DriverGrantBucketAccessResponse.BucketInfo.bucket_info",
    ),
    # KMS v2: the plaintext kube-apiserver has encrypted and gets back is the seed of its
    # data encryption key; whoever holds it reads every Secret it protects.
    "kms.v2": (
        "v2.EncryptRequest.plaintext",
        "v2.DecryptResponse.plaintext",
    ),
}

# Possibly sensitive by the spec's own words or by common use; `--redact-defaults off` drops them.
ADVISORY_PATHS: dict[str, tuple[str, ...]] = {
    "csi.v1": (
        "csi.v1.VolumeCapability.MountVolume.mount_flags",  # CSI v1.12 §VolumeCapability
        "csi.v1.NodePublishVolumeRequest.volume_context",  # service-account tokens
    ),
    "csi.v0": (
        "csi.v0.VolumeCapability.MountVolume.mount_flags",  # CSI v0.3 §VolumeCapability
        "csi.v0.NodePublishVolumeRequest.volume_attributes",
    ),
    # KMS v2 EncryptResponse.annotations: plugin-defined metadata kept with the data; plugins
    # put wrapped key material there, and the API leaves its protection to them.
    "kms.v2": (
        "v2.EncryptResponse.annotations",
        "v2.DecryptRequest.annotations",
    ),
    # Environment variables a device plugin injects into containers: licence keys and
    # access tokens travel this way (the names stay visible).
    "deviceplugin.v1beta1": ("v1beta1.ContainerAllocateResponse.envs",),
}


@dataclass(frozen=True)
class RedactSettings:
    """Which fields are masked besides those the specs mark secret."""

    redact: tuple[str, ...] = setting(
        "--redact",
        "also mask this field everywhere message content is shown "
        "(<message full name>.<field>, e.g. csi.v1.NodeStageVolumeRequest.volume_context)",
        default=[],
        repeatable=True,
        metavar="FIELD_PATH",
    )
    redact_defaults: str = setting(
        "--redact-defaults",
        "mask fields the specs call possibly sensitive (mount_flags) and fields that carry "
        "tokens or key material in practice (NodePublishVolume's volume_context, KMS v2 "
        "annotations, device plugin envs)",
        default="on",
        choices=("on", "off"),
    )


OPTIONS: list[Option] = options_of(RedactSettings)


class Plan:
    """What to do with one message type's fields: mask them, or descend into them."""

    __slots__ = ("fields", "full_name")

    def __init__(self, full_name: str) -> None:
        self.full_name = full_name
        # field name -> MASK (sensitive) or the Plan of its message (or map value) type
        self.fields: dict[str, str | Plan] = {}

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{k}={v if isinstance(v, str) else v.full_name}" for k, v in self.fields.items()
        )
        return f"Plan({self.full_name}: {inner})"


@functools.cache
def _is_map(fd: FieldDescriptor) -> bool:
    mt = fd.message_type
    return mt is not None and fd.is_repeated and mt.GetOptions().map_entry


def _value_fd(fd: FieldDescriptor) -> FieldDescriptor:
    """The value field of a map field's entry type."""
    entry: Any = fd.message_type
    value: FieldDescriptor = entry.fields_by_name["value"]
    return value


def _target(fd: FieldDescriptor) -> Descriptor | None:
    """The message type a field leads to (a map's value type), or None for scalars."""
    mt = fd.message_type
    if mt is None:
        return None
    if mt.GetOptions().map_entry:
        return mt.fields_by_name["value"].message_type
    return mt


def _all_messages(desc: Descriptor) -> Iterable[Descriptor]:
    yield desc
    for nested in desc.nested_types:
        yield from _all_messages(nested)


def _resolve_path(
    path: str, sets: Iterable[SpecInfo] = ()
) -> tuple[SpecInfo, Descriptor, FieldDescriptor]:
    """`<message full name>.<field>` in whichever spec defines it (a bundled one, or one of
    the descriptor-set specs ``sets``); ConfigError otherwise."""
    message_name, _, field_name = path.strip().rpartition(".")
    candidates: list[tuple[str, SpecInfo | None]] = [
        (s.name, s) for s in sets if message_name in s.message_classes
    ]
    candidates += [(n, None) for n in SPEC_NAMES if message_name.startswith(spec_package(n) + ".")]
    for spec_name, loaded in candidates:
        spec = loaded if loaded is not None else load_spec(spec_name)
        if message_name not in spec.message_classes:
            raise ConfigError(f"--redact {path}: {spec_name} has no message {message_name}")
        desc = spec.descriptor(message_name)
        fd = desc.fields_by_name.get(field_name)
        if fd is None:
            raise ConfigError(f"--redact {path}: {message_name} has no field {field_name!r}")
        return spec, desc, fd
    raise ConfigError(
        f"--redact {path!r}: expected <message full name>.<field> in one of "
        f"the packages {', '.join(dict.fromkeys(spec_package(n) for n in SPEC_NAMES))}"
        " or a --descriptor-set"
        " (e.g. csi.v1.NodePublishVolumeRequest.volume_context)"
    )


class _Full(Exception):
    """The render budget ran out; carries where, innermost first."""

    def __init__(self, partial: Any = None) -> None:
        super().__init__()
        self.where: list[str] = []
        self.partial = partial  # a cut value still to be placed by the container


class _Budget:
    __slots__ = ("left",)

    def __init__(self, left: float) -> None:
        self.left = left

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _Full


_UNLIMITED = math.inf
RENDERED_ENTRIES_MAX = 256  # entries of sampled lists remembered rendered: a few pages' heads
_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
        FieldDescriptor.TYPE_SINT64,
    }
)
_WRAPPERS = frozenset(
    f"google.protobuf.{n}Value"
    for n in ("Bool", "Int32", "Int64", "UInt32", "UInt64", "Float", "Double", "String", "Bytes")
)


class Redactor:
    """Redaction plans for some specs, and the renderers every output must go through."""

    def __init__(
        self,
        specs: Iterable[SpecInfo],
        extra_paths: Sequence[str] = (),
        defaults: bool = True,
    ) -> None:
        self.specs = tuple(specs)
        self.defaults = defaults
        # Every configured path is checked, even for specs this proxy does not serve (a path
        # into a bundled spec reads that spec's descriptors).
        self._masked: set[tuple[str, str]] = set()
        sets = [s for s in self.specs if not s.bundled]
        for path in extra_paths:
            _, desc, fd = _resolve_path(path, sets)
            self._masked.add((desc.full_name, fd.name))
        self._plans: dict[str, Plan] = {}
        # (list field, hash of an entry's wire bytes) -> (the entry rendered, bytes of budget
        # it took), for the entries of sampled lists: a page listed again renders its head
        # from here. A render depends on the bytes and the plans alone; callers never
        # change a render (scrub makes a new one).
        self._entries: dict[tuple[str, int], tuple[Any, int]] = {}
        # A message of a spec exists only once its descriptors are read, and by then its
        # plans are made: the renderers never find a spec unplanned.
        for spec in self.specs:
            spec.when_loaded(self._plan_spec)

    @property
    def plans(self) -> dict[str, Plan]:
        """Every plan of every spec, full message name -> plan (reads the descriptors of
        the specs no message has needed yet)."""
        for spec in self.specs:
            spec.load()
        return self._plans

    # -- plans (startup) -------------------------------------------------------------------

    def _is_masked(self, spec: SpecInfo, desc: Descriptor, fd: FieldDescriptor) -> bool:
        return (desc.full_name, fd.name) in self._masked or spec.is_secret_field(fd)

    def _plan_spec(self, spec: SpecInfo) -> None:
        paths = SPEC_SECRET_PATHS.get(spec.name, ()) if spec.bundled else ()
        if self.defaults and spec.bundled:
            paths += ADVISORY_PATHS.get(spec.name, ())
        for path in paths:
            message_name, _, field_name = path.rpartition(".")
            fd = spec.descriptor(message_name).fields_by_name[field_name]
            self._masked.add((message_name, fd.name))
        descs: dict[str, Descriptor] = {}
        for cls in spec.message_classes.values():
            root: Any = cls.DESCRIPTOR
            for d in _all_messages(root):
                descs[d.full_name] = d
        direct: dict[str, set[str]] = {}
        edges: dict[str, list[tuple[str, str]]] = {}  # type -> [(field, target type)]
        for name, d in descs.items():
            if d.GetOptions().map_entry:
                continue
            direct[name] = {fd.name for fd in d.fields if self._is_masked(spec, d, fd)}
            edges[name] = [
                (fd.name, t.full_name)
                for fd in d.fields
                if fd.name not in direct[name] and (t := _target(fd)) is not None
            ]
        # Sensitive-reachable is a fixed point over the type graph: cycles need no depth limit.
        sensitive = {n for n, fields in direct.items() if fields}
        changed = True
        while changed:
            changed = False
            for name, out in edges.items():
                if name not in sensitive and any(t in sensitive for _, t in out):
                    sensitive.add(name)
                    changed = True
        for name in sensitive:
            self._plans[name] = Plan(name)
        for name in sensitive:
            plan = self._plans[name]
            for field_name in sorted(direct[name]):
                plan.fields[field_name] = MASK
            for field_name, target in edges[name]:
                if target in sensitive:
                    plan.fields[field_name] = self._plans[target]

    def plan_for(self, message_type: Descriptor | str) -> Plan | None:
        """The plan of a message type; None when nothing sensitive is reachable from it."""
        if isinstance(message_type, str):
            return self.plans.get(message_type)
        return self._plans.get(message_type.full_name)

    def is_masked(self, fd: FieldDescriptor) -> bool:
        """Whether this field itself is masked (not merely leads to a masked field)."""
        owner: Any = fd.containing_type
        plan = self._plans.get(owner.full_name)
        return plan is not None and plan.fields.get(fd.name) is MASK

    # -- rendering -------------------------------------------------------------------------

    def render(
        self, message: Message, max_bytes: int | None = None, sample: Sample | None = None
    ) -> dict[str, Any]:
        """The message as a JSON-ready dict with every sensitive value masked.

        With ``max_bytes``, rendering stops once about that many bytes of JSON are produced;
        the result then holds :data:`TRUNCATED_KEY` saying where it stopped. ``sample``: the
        message is a sample of a larger one, whose real positions the stop names.
        """
        budget = _Budget(_UNLIMITED if max_bytes is None else max_bytes)
        out: dict[str, Any] = {}
        plan = self._plans.get(message.DESCRIPTOR.full_name)
        try:
            if sample is not None and message is sample.message:
                self._fill(out, message, plan, budget, sample.raw)
            else:
                self._fill(out, message, plan, budget)
        except _Full as full:
            if sample is not None and len(full.where) >= 2 and full.where[-1] in sample.totals:
                name = full.where[-1]
                position = full.where[-2][1:].partition(" ")[0]
                if position.isdigit():
                    real = sample.indices[name][int(position)]
                    full.where[-2] = f"[{real} of {sample.totals[name]}]"
            where = ".".join(reversed(full.where)).replace(".[", "[") or "start"
            out[TRUNCATED_KEY] = f"over {max_bytes} bytes; stopped at {where}"
        return out

    def _fill(
        self,
        out: dict[str, Any],
        message: Message,
        plan: Plan | None,
        budget: _Budget,
        raws: Mapping[str, Sequence[bytes]] | None = None,
    ) -> None:
        """``raws``: the wire bytes of each entry of some lists of ``message`` (a sample's)."""
        for fd, value in message.ListFields():
            name = fd.name
            action = plan.fields.get(name) if plan is not None else None
            try:
                budget.spend(len(name) + 4)
                if action is MASK:
                    masked = out[name] = _masked(fd, value)
                    budget.spend(len(str(masked)))
                elif _is_map(fd):
                    mapped: dict[str, Any] = {}
                    out[name] = mapped  # attached first: a cut render keeps what it has
                    budget.spend(2)
                    self._fill_map(mapped, fd, value, action, budget)
                elif fd.is_repeated:
                    items: list[Any] = []
                    out[name] = items
                    budget.spend(2)
                    if raws is not None and name in raws:
                        self._fill_entries(items, fd, value, action, budget, raws[name])
                    else:
                        self._fill_list(items, fd, value, action, budget)
                elif fd.message_type is not None:
                    self._put(out, name, value, action, budget)
                else:
                    out[name] = _scalar(fd, value, budget)
            except _Full as full:
                if full.partial is not None:
                    out[name], full.partial = full.partial, None
                full.where.append(name)
                raise

    def _put(
        self, out: dict[str, Any], key: str, message: Message, plan: Any, budget: _Budget
    ) -> None:
        special = _well_known(message)
        if special is not None:
            budget.spend(len(str(special)) + 2)
            out[key] = special
            return
        sub: dict[str, Any] = {}
        out[key] = sub
        budget.spend(2)
        self._fill(sub, message, plan if isinstance(plan, Plan) else None, budget)

    def _fill_map(
        self, out: dict[str, Any], fd: FieldDescriptor, value: Any, plan: Any, budget: _Budget
    ) -> None:
        value_fd = _value_fd(fd)
        for key in value:
            k = _map_key(key)
            try:
                budget.spend(len(k) + 4)
                if value_fd.message_type is not None:
                    self._put(out, k, value[key], plan, budget)
                else:
                    out[k] = _scalar(value_fd, value[key], budget)
            except _Full as full:
                if full.partial is not None:
                    out[k], full.partial = full.partial, None
                full.where.append(f"[{k!r}]")
                raise

    def _fill_list(
        self, out: list[Any], fd: FieldDescriptor, value: Any, plan: Any, budget: _Budget
    ) -> None:
        is_message = fd.message_type is not None
        for index, item in enumerate(value):
            try:
                budget.spend(1)
                if is_message:
                    self._append(out, item, plan, budget)
                else:
                    out.append(_scalar(fd, item, budget))
            except _Full as full:
                if full.partial is not None:
                    out.append(full.partial)
                    full.partial = None
                full.where.append(f"[{index} of {len(value)}]")
                raise

    def _append(self, out: list[Any], item: Message, plan: Any, budget: _Budget) -> Any:
        """Render ``item`` onto ``out``; a render cut by the budget is appended as far as it
        went before _Full goes on up."""
        holder: dict[str, Any] = {}
        try:
            self._put(holder, "", item, plan, budget)
        finally:
            if "" in holder:
                out.append(holder[""])
        return holder[""]

    def _fill_entries(
        self,
        out: list[Any],
        fd: FieldDescriptor,
        value: Any,
        plan: Any,
        budget: _Budget,
        raws: Sequence[bytes],
    ) -> None:
        """:meth:`_fill_list` for a list of messages whose wire bytes are known: an entry
        rendered before is taken as it was, with the same budget spent, when it fits whole
        (a spend never goes below zero then); otherwise it is rendered, and cut as before."""
        known = self._entries
        field = fd.full_name
        for index, item in enumerate(value):
            key = (field, hash(raws[index]))
            seen = known.get(key)
            if seen is not None and budget.left - 1 - seen[1] >= 0:
                budget.left -= 1 + seen[1]
                out.append(seen[0])
                continue
            try:
                budget.spend(1)
                before = budget.left
                rendered = self._append(out, item, plan, budget)
            except _Full as full:
                full.where.append(f"[{index} of {len(value)}]")
                raise
            if before != _UNLIMITED:  # an unlimited render does not count what it spends
                remember(known, key, (rendered, int(before - budget.left)), RENDERED_ENTRIES_MAX)

    def render_call(
        self,
        message: Message,
        call: Call,
        max_bytes: int | None = None,
        raw: bytes | None = None,
        sample: Sample | None = None,
    ) -> dict[str, Any]:
        """:meth:`render`, and any secret value of the call's request masked wherever it
        appears (a plugin echoing a secret into a non-secret field of its response).

        ``raw``, the message's wire bytes, makes this cheaper: the rendered message is only
        searched when some secret occurs in them more often than the secret fields themselves
        account for."""
        return self.scrub_call(self.render(message, max_bytes, sample), call, raw)

    def scrub_call(
        self, rendered: dict[str, Any], call: Call, raw: bytes | None = None
    ) -> dict[str, Any]:
        """``rendered`` (from :meth:`render`, left unchanged) with any secret value of the
        call's request masked wherever it appears; ``raw`` as for :meth:`render_call`."""
        secrets = self.call_secrets(call)
        if secrets and raw is not None:
            own = 1 if call.request is not None and raw is call.request.raw else 0
            if not any(raw.count(s.encode()) > own for s in secrets):
                return rendered
        return scrub(rendered, secrets) if secrets else rendered

    # -- secret values and free text -------------------------------------------------------

    def secret_values(self, message: Message) -> frozenset[str]:
        """Every sensitive value in ``message``, as text (for masking free text)."""
        plan = self._plans.get(message.DESCRIPTOR.full_name)
        if plan is None:
            return frozenset()
        found: set[str] = set()
        self._collect(message, plan, found)
        return frozenset(v for v in found if len(v) >= MIN_TEXT_SECRET)

    def _collect(self, message: Message, plan: Plan, found: set[str]) -> None:
        for fd, value in message.ListFields():
            action = plan.fields.get(fd.name)
            if action is None:
                continue
            if action is MASK:
                _collect_all(fd, value, found)
                continue
            assert isinstance(action, Plan)
            if _is_map(fd):
                for item in value.values():
                    self._collect(item, action, found)
            elif fd.is_repeated:
                for item in value:
                    self._collect(item, action, found)
            else:
                self._collect(value, action, found)

    def call_secrets(self, call: Call) -> frozenset[str]:
        """The secret values of the call's request; computed once per call."""
        cached: frozenset[str] | None = call.stage_state.get("redact.secrets")
        if cached is not None:
            return cached
        secrets: frozenset[str] = frozenset()
        request = call.request
        cls = request.cls if request is not None else None
        if request is not None and cls is not None and cls.DESCRIPTOR.full_name in self._plans:
            message = request.message
            if message is not None:
                secrets = self.secret_values(message)
        call.stage_state["redact.secrets"] = secrets
        return secrets

    def mask_text(self, text: str, call: Call) -> str:
        """``text`` with every secret value of the call's request replaced by ``***``."""
        if not text:
            return text
        secrets = self.call_secrets(call)
        if not secrets:
            return text
        return _mask_in(text, sorted(secrets, key=len, reverse=True))


def _mask_in(text: str, ordered: Sequence[str]) -> str:
    for value in ordered:
        if value in text:
            text = text.replace(value, MASK)
    return text


def scrub(rendered: Any, secrets: Iterable[str]) -> Any:
    """A rendered value with every occurrence of ``secrets`` in its strings (and map keys)
    replaced by ``***``. Returns a new structure; the input is left as it was."""
    ordered = sorted(secrets, key=len, reverse=True)
    if not ordered:
        return rendered

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return _mask_in(value, ordered)
        if isinstance(value, dict):
            return {_mask_in(k, ordered): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(rendered)


def _map_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def _scalar(fd: FieldDescriptor, value: Any, budget: _Budget) -> Any:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        cost = len(value) + 2
        if cost > budget.left:
            keep = max(int(budget.left) - 2, 0)
            budget.left = -1.0
            raise _Full(value[:keep] + "…")
        budget.spend(cost)
        return value
    if t == FieldDescriptor.TYPE_BYTES:
        if len(value) * 4 // 3 + 4 > budget.left:
            budget.left = -1.0
            raise _Full("…")
        text = base64.b64encode(value).decode("ascii")
        budget.spend(len(text) + 2)
        return text
    if t == FieldDescriptor.TYPE_ENUM:
        enum_type: Any = fd.enum_type
        ev = enum_type.values_by_number.get(value)
        name = ev.name if ev is not None else value
        budget.spend(len(str(name)) + 2)
        return name
    if t in _INT64_TYPES:
        text = str(value)
        budget.spend(len(text) + 2)
        return text
    if isinstance(value, float) and not math.isfinite(value):
        budget.spend(10)
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    budget.spend(6)
    return value


def _well_known(message: Message) -> Any:
    full_name = message.DESCRIPTOR.full_name
    if not full_name.startswith("google.protobuf."):
        return None
    if full_name in _WRAPPERS:
        desc: Any = message.DESCRIPTOR
        inner: Any = message
        return _scalar(desc.fields_by_name["value"], inner.value, _Budget(math.inf))
    if full_name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        wkt: Any = message
        return wkt.ToJsonString()
    return None


def _masked(fd: FieldDescriptor, value: Any) -> Any:
    if _is_map(fd):
        value_fd = _value_fd(fd)
        if value_fd.message_type is None:
            return {_map_key(k): MASK for k in value}
        return {_map_key(k): _mask_all(value[k]) for k in value}
    return MASK


def _mask_all(message: Message) -> dict[str, Any]:
    """A sensitive map's message value: structure and map keys visible, every leaf masked."""
    return {fd.name: _masked(fd, value) for fd, value in message.ListFields()}


def _collect_all(fd: FieldDescriptor, value: Any, found: set[str]) -> None:
    if _is_map(fd):
        value_fd = _value_fd(fd)
        for item in value.values():
            _collect_leaf(value_fd, item, found)
    elif fd.is_repeated:
        for item in value:
            _collect_leaf(fd, item, found)
    else:
        _collect_leaf(fd, value, found)


def _collect_leaf(fd: FieldDescriptor, value: Any, found: set[str]) -> None:
    if fd.message_type is not None:
        for sub_fd, sub_value in value.ListFields():
            _collect_all(sub_fd, sub_value, found)
    elif isinstance(value, bytes):
        found.add(value.decode("utf-8", "replace"))
        found.add(base64.b64encode(value).decode("ascii"))
    elif isinstance(value, str):
        found.add(value)
    elif not isinstance(value, bool):
        found.add(str(value))


@functools.cache
def _cached(specs: tuple[SpecInfo, ...], paths: tuple[str, ...], defaults: bool) -> Redactor:
    return Redactor(specs, paths, defaults)


def for_specs(
    specs: Iterable[str | SpecInfo] = SPEC_NAMES,
    paths: Sequence[str] = (),
    defaults: bool = True,
) -> Redactor:
    """A shared Redactor for this configuration; plans are computed once per configuration.
    ``specs``: bundled spec names or loaded specs (descriptor sets are only the latter)."""
    loaded = tuple(s if isinstance(s, SpecInfo) else load_spec(s) for s in specs)
    return _cached(loaded, tuple(paths), defaults)


def from_settings(
    settings: RedactSettings, specs: Iterable[str | SpecInfo] | None = None
) -> Redactor:
    """The Redactor the settings configure. Every stage that shows message content (call
    log, validation reports, spans, errors) gets its Redactor here, in ``build``."""
    chosen = tuple(specs) if specs is not None else SPEC_NAMES
    return for_specs(chosen, settings.redact, settings.redact_defaults != "off")
