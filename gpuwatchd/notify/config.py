"""Config of notification delivery (``notify:`` in the YAML file).

Shape follows Alertmanager (route timings, receivers, inhibit rules) but the route tree is a flat ordered list:
first match wins unless ``continue: true``; alerts no route takes go to ``default_receiver``.
Webhook URLs, HMAC secrets and header values are ``SecretStr`` (``gpuwatchd.config.types``): their repr/str is
``**********``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from gpuwatchd.config.types import Duration, FieldError, PositiveDuration, SecretStr, Section
from gpuwatchd.notify.matchers import Matcher, parse_matcher

ReceiverType = Literal["slack", "discord", "teams", "mattermost", "webhook", "alertmanager", "ntfy"]

# One incident per GPU and alert kind: a host has few GPUs (<= 8-16), so per-GPU messages stay few, each message
# names one GPU (actionable), and inhibition is per GPU as well. Host-wide failures raise their own alert
# (GpuCountLow), so grouping across GPUs would only merge unrelated incidents. Alertmanager's own example is
# [alertname, cluster]; the ops reference suggests [alertname, host] — we add uuid for the reasons above.
DEFAULT_GROUP_BY = ("alertname", "host", "uuid")
# Alertmanager's defaults (dispatch/route.go: GroupWait 30s, GroupInterval 5m, RepeatInterval 4h).
DEFAULT_GROUP_WAIT = 30.0
DEFAULT_GROUP_INTERVAL = 300.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0
# Presence alerts (a GPU or its dock gone, fewer GPUs than expected) describe one state of one GPU that flips when
# the hardware comes back: nothing accumulates in their groups for group_interval to batch, and the user is waiting
# to hear that the GPU is back. Their default route sends them at once (group_wait 0) and the resolution within
# PRESENCE_GROUP_INTERVAL of the GPU's return (a cable flapping faster still yields at most 4 messages a minute).
PRESENCE_ALERTS = ("GpuLost", "GpuRemoved", "GpuCountLow", "GpuDockUnauthorized")
PRESENCE_GROUP_INTERVAL = 15.0
# Prometheus' --rules.alert.resend-delay default: how often firing alerts are re-posted to an Alertmanager.
DEFAULT_ALERTMANAGER_RESEND = 60.0
# A notification older than this is dropped (failure counted): a day-old "firing" message misleads more than it
# helps, and repeat_interval re-sends what is still firing anyway.
DEFAULT_MAX_RETRY_AGE = 24 * 3600.0
# Slack asks for <= 1 message per second per webhook (api.slack.com/docs/rate-limits); 60/min is a fair default
# for every chat service (Teams throttles above 4/s, Google Chat at 60/min per space).
DEFAULT_RATE_LIMIT_PER_MINUTE = 60.0


# A silence is for a maintenance window or a known issue; one longer than a week is usually a forgotten one
# (Alertmanager has no cap; a week is amtool's longest example). Extend by creating a new one.
DEFAULT_MAX_SILENCE_DURATION = 7 * 86400.0
# One host has a few GPUs and a handful of alert names: 100 live silences is far past any real need, and bounds the
# matching done on every evaluation (Alertmanager: --silences.max-silences, unlimited by default).
DEFAULT_MAX_SILENCES = 100
# Shortest write token accepted: 16 characters is 64+ bits from `openssl rand -hex`, past online guessing.
MIN_TOKEN_LENGTH = 16
# Longest regex a silence may carry: RE2 caps program size; Python has no such guard, so we cap the text.
DEFAULT_MAX_REGEX_LENGTH = 256


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(r"[\x20-\x7e\t]*")


def _parse_matchers(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """Matchers are strings in the file (``severity="critical"``): a list of them under ``keys`` read as Matchers,
    a bad one reported at its key (as a whole)."""
    out = dict(data)
    for key in keys:
        v = data.get(key)
        if isinstance(v, list | tuple) and all(isinstance(x, str) for x in v):
            try:
                out[key] = tuple(parse_matcher(x) for x in v)
            except ValueError as e:
                raise FieldError(key, str(e)) from None
    return out


@dataclass(frozen=True, slots=True)
class Member:
    """One URL a receiver posts to, with the key its outbox rows, retry state and metrics are kept under.

    A receiver with one URL has one member keyed by the receiver's name. An ``alertmanager`` receiver with ``urls``
    (an HA cluster) has one per URL: member 0 keeps the receiver's name (so adding a second URL keeps the first one's
    queue), member i > 0 is ``name#i`` (``#`` cannot occur in a receiver name, so keys never collide).
    """

    key: str
    url: SecretStr
    endpoint: str  # redacted name for logs and errors, e.g. ``alertmanager:fleet#1``


def check_url(v: SecretStr) -> SecretStr:
    """An http(s) URL with a host, a valid port and no control characters; the message never echoes it (a secret)."""
    url = v.get_secret_value()
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        port = parts.port  # raises for a port that is not a number in 0..65535
    except ValueError:  # its text can quote the URL
        raise ValueError("not a valid URL") from None
    if not ok:
        raise ValueError("not an http(s) URL")
    if port == 0:
        raise ValueError("not a valid URL (port 0)")
    if not url.isprintable():  # CR, LF, TAB, NUL...: the HTTP client refuses the request at every attempt
        raise ValueError("not a valid URL (contains control characters)")
    return v


def member_key(name: str, index: int) -> str:
    """The outbox/metrics key of member ``index`` of receiver ``name``."""
    return name if index == 0 else f"{name}#{index}"


class ReceiverConfig(Section, frozen=True, kw_only=True):
    """One destination: a chat webhook, a generic JSON webhook or an Alertmanager (or an HA cluster of them)."""

    # No message quotes the offending input (msgspec's texts do not, and none of ours does): here it is a secret.

    name: Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")]
    type: ReceiverType
    # ``url`` or ``urls``, not both. ``urls`` (alertmanager only): every member of an Alertmanager cluster; every
    # alert is posted to each (Alertmanager's README: never through a load balancer) and the cluster sends each
    # notification once. Each member has its own queue and retries: one that is down delays nothing for the others.
    urls: tuple[SecretStr, ...] = ()
    url: SecretStr
    # Generic webhook only: HMAC-SHA256 of the body with this key in the ``X-Gpuwatchd-Signature`` header.
    hmac_secret: SecretStr | None = None
    headers: dict[str, SecretStr] = msgspec.field(default_factory=dict)
    # At least one message an hour (a smaller rate would hold a message back for longer than it stays useful).
    rate_limit_per_minute: Annotated[float, msgspec.Meta(ge=1 / 60, le=1e6)] = DEFAULT_RATE_LIMIT_PER_MINUTE
    timeout: PositiveDuration = 10.0
    send_resolved: bool = True

    @classmethod
    def before(cls, data: dict[str, Any]) -> dict[str, Any]:
        has_url, has_urls = data.get("url") is not None, data.get("urls") is not None
        if has_url and has_urls:
            raise ValueError("give either url or urls, not both")
        if has_urls:
            urls = data["urls"]
            if not isinstance(urls, list | tuple) or not urls:
                raise ValueError("urls: must be a non-empty list of URLs")
            return {**data, "url": urls[0]}
        if not has_url:
            raise ValueError("url (or, for an alertmanager cluster, urls) is required")
        return data

    @classmethod
    def _check_url(cls, v: SecretStr, data: dict[str, Any]) -> SecretStr:
        if "urls" not in data or data["urls"]:
            return v  # taken from urls, which reported on it already (or failed)
        return check_url(v)

    @classmethod
    def _check_urls(cls, v: tuple[SecretStr, ...], data: dict[str, Any]) -> tuple[SecretStr, ...]:
        for i, u in enumerate(v):
            try:
                check_url(u)
            except ValueError as e:
                raise ValueError(f"entry {i}: {e}") from None
        return v

    @classmethod
    def _check_headers(cls, v: dict[str, SecretStr], data: dict[str, Any]) -> dict[str, SecretStr]:
        # A CR/LF in a header is refused by the HTTP client at every send attempt: the message would be retried
        # until it expires and never delivered. Names are RFC 9110 tokens; values visible ASCII, space and tab.
        for name, value in v.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name[:40]!r} is not a valid HTTP field name")
            if not _FIELD_VALUE.fullmatch(value.get_secret_value()):
                raise ValueError(f"header {name!r}: value must be visible ASCII (no CR, LF or control characters)")
        return v

    def check(self) -> None:
        if len(self.urls) > 1 and self.type != "alertmanager":
            raise ValueError(
                f"urls: several URLs are for an alertmanager receiver (an HA cluster); a {self.type} receiver posts"
                " to one url (define one receiver per destination)"
            )
        values = [u.get_secret_value() for u in self.urls]
        for i, u in enumerate(values):
            if u in values[:i]:
                raise ValueError(f"urls: entry {i} repeats a URL (every alert would be posted twice to one member)")

    @property
    def endpoint(self) -> str:
        """Redacted name used in logs, metrics and errors, e.g. ``slack:team-alerts``."""
        return f"{self.type}:{self.name}"

    @property
    def members(self) -> tuple[Member, ...]:
        """One :class:`Member` per URL (one for every receiver but an Alertmanager cluster)."""
        urls = self.urls or (self.url,)
        if len(urls) == 1:
            return (Member(self.name, urls[0], self.endpoint),)
        return tuple(
            Member(member_key(self.name, i), u, f"{self.endpoint}#{i}") for i, u in enumerate(urls)
        )


class RouteConfig(Section, frozen=True):
    """Alerts matching all ``matchers`` go to ``receiver`` (default receiver if unset), with optional timings."""

    matchers: tuple[Matcher, ...] = ()
    receiver: str | None = None
    continue_: bool = msgspec.field(default=False, name="continue")
    group_by: tuple[str, ...] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None

    @classmethod
    def before(cls, data: dict[str, Any]) -> dict[str, Any]:
        return _parse_matchers(data, "matchers")


class InhibitRuleConfig(Section, frozen=True):
    """While a firing alert matches ``source_matchers``, ``target_matchers`` alerts with equal labels are muted."""

    source_matchers: tuple[Matcher, ...]
    target_matchers: tuple[Matcher, ...] = ()
    equal: tuple[str, ...] = ()

    @classmethod
    def before(cls, data: dict[str, Any]) -> dict[str, Any]:
        return _parse_matchers(data, "source_matchers", "target_matchers")


def _default_inhibit_rules() -> tuple[InhibitRuleConfig, ...]:
    # One fault, one message (docs/alerts.md "One incident, one message"). A lost or removed GPU makes every other
    # alert about it noise (its Xid 79, throttling, leak, link...): the loss is what the operator needs. Loss and
    # removal do not mute each other (the presence rule raises only one of them per GPU). GpuCountLow only
    # restates, host-wide, a GPU that is lost, removed or stuck behind an unauthorized dock: those speak instead.
    targets = (parse_matcher('alertname!~"GpuLost|GpuRemoved"'),)
    per_gpu = tuple(
        InhibitRuleConfig(
            source_matchers=(parse_matcher(f'alertname="{name}"'),), target_matchers=targets, equal=("host", "uuid")
        )
        for name in ("GpuLost", "GpuRemoved")
    )
    count = InhibitRuleConfig(
        source_matchers=(parse_matcher('alertname=~"GpuLost|GpuRemoved|GpuDockUnauthorized"'),),
        target_matchers=(parse_matcher('alertname="GpuCountLow"'),),
        equal=("host",),
    )
    return (*per_gpu, count)


def _default_routes() -> tuple[RouteConfig, ...]:
    # Presence alerts at once, and their resolution soon after the GPU is back (PRESENCE_GROUP_INTERVAL).
    # Other critical alerts (uncorrectable ECC, Xids that need a reset) skip group_wait: there is nothing to wait for.
    presence = parse_matcher(f'alertname=~"{"|".join(PRESENCE_ALERTS)}"')
    return (
        RouteConfig(matchers=(presence,), group_wait=0.0, group_interval=PRESENCE_GROUP_INTERVAL),
        RouteConfig(matchers=(parse_matcher('severity="critical"'),), group_wait=0.0),
    )


class ApiConfig(Section, frozen=True):
    """Who may change silences over HTTP, and how big they may get (reading is open, like ``/metrics``)."""

    # When set, POST/DELETE need ``Authorization: Bearer <token>`` (compared in constant time).
    write_token: SecretStr | None = None
    # Refuse writes from non-loopback peers: the daemon listens on all interfaces for Prometheus, and anyone who
    # reaches the port must not be able to mute alerts. A local ``curl`` still works.
    write_from_loopback_only: bool = True
    # Pending plus active silences at most; more are refused with 409 until one expires.
    max_silences: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MAX_SILENCES
    # Longest silence (endsAt - startsAt); a longer one is refused: extend by creating a new one.
    max_silence_duration: Annotated[Duration, msgspec.Meta(gt=0)] = DEFAULT_MAX_SILENCE_DURATION
    # Longest regex in a silence matcher; regexes run on RE2 (linear time), which has no backreferences or lookaround.
    max_regex_length: Annotated[int, msgspec.Meta(ge=1)] = DEFAULT_MAX_REGEX_LENGTH

    @classmethod
    def _check_write_token(cls, v: SecretStr | None, data: dict[str, Any]) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"at least {MIN_TOKEN_LENGTH} characters (e.g. `openssl rand -hex 16`)")
        return v

    def check(self) -> None:
        if not self.write_from_loopback_only and self.write_token is None:
            raise ValueError(
                "write_from_loopback_only: false needs write_token, or anyone who reaches the port can silence alerts"
            )


class NotifyConfig(Section, frozen=True):
    """Everything about alert delivery; with no receivers nothing is sent."""

    group_by: tuple[str, ...] = DEFAULT_GROUP_BY
    group_wait: Duration = DEFAULT_GROUP_WAIT
    group_interval: Duration = DEFAULT_GROUP_INTERVAL
    repeat_interval: Duration = DEFAULT_REPEAT_INTERVAL
    receivers: tuple[ReceiverConfig, ...] = ()
    default_receiver: str | None = None
    routes: tuple[RouteConfig, ...] = msgspec.field(default_factory=_default_routes)
    inhibit_rules: tuple[InhibitRuleConfig, ...] = msgspec.field(default_factory=_default_inhibit_rules)
    max_retry_age: Duration = DEFAULT_MAX_RETRY_AGE
    # Backoff of retried sends: exponential from initial to max, +-50 % jitter (Alertmanager: 500 ms x1.5, 60 s).
    retry_initial: PositiveDuration = 0.5
    retry_max: PositiveDuration = 60.0
    alertmanager_resend: Duration = DEFAULT_ALERTMANAGER_RESEND
    api: ApiConfig = ApiConfig()
    # Shown in messages and in the webhook's externalURL (e.g. this host's /api/v1/alerts); empty: omitted.
    external_url: Annotated[str, msgspec.Meta(max_length=2048)] = ""

    @classmethod
    def _check_group_interval(cls, v: float, data: dict[str, Any]) -> float:
        if v <= 0:
            raise ValueError("must be > 0")
        return v

    _check_repeat_interval = _check_group_interval
    _check_alertmanager_resend = _check_group_interval

    def check(self) -> None:
        if self.retry_max < self.retry_initial:
            raise ValueError("retry_max must be >= retry_initial")
        names = [r.name for r in self.receivers]
        seen: set[str] = set()
        for i, n in enumerate(names):
            if n in seen:
                raise ValueError(f"receivers[{i}].name: duplicate receiver name {n!r}")
            seen.add(n)
        if self.default_receiver is not None and self.default_receiver not in seen:
            raise ValueError(f"default_receiver: unknown receiver {self.default_receiver!r}")
        for i, r in enumerate(self.routes):
            if r.receiver is not None and r.receiver not in seen:
                raise ValueError(f"routes[{i}].receiver: unknown receiver {r.receiver!r}")

    def receiver(self, name: str) -> ReceiverConfig:
        """The receiver called ``name`` (KeyError if none)."""
        for r in self.receivers:
            if r.name == name:
                return r
        raise KeyError(name)

    @property
    def fallback_receiver(self) -> str | None:
        """Where unmatched alerts go: ``default_receiver``, else the first receiver, else nowhere."""
        if self.default_receiver is not None:
            return self.default_receiver
        return self.receivers[0].name if self.receivers else None
