"""`python -m ota`: the fleet operator's tool for model updates.

  keygen DIR                          a key pair; prints the public key for ota.trusted_keys
  manifest MODEL.onnx --release N --version V [--expires-days D] [--device-class C] [--notes T]
           [--tier VARIANT.onnx ...]
  sign MANIFEST --key KEY [--key KEY2]
  verify SIGNED --public-key B64 [...]
  serve DIR [--port 8000] [--bind ADDR]  the release files over HTTP with Range (loopback unless
                                      --bind names an address: 0.0.0.0 or the LAN's); no listing
  status [--group G] [--json] [--watch]          the inventory, from retained state
  offer SIGNED --base-url URL (--node N | --group G | --all) [--wait S]
  rollout SIGNED --base-url URL (--nodes A,B | --group G | --device-class C) [--waves 1,10,50,100]
          [--success-threshold 0.9] [--error-threshold 0.1] [--soak S] [--node-timeout S]
          [--rollback-on-halt] [--state-file FILE]
  rollout --resume FILE               continue a rollout whose tool died
  rollout-control FILE pause|resume|abort|show
  rollout-report FILE                 the Markdown report and its chart, again
  revoke --key KEY [--min-release N] [--revoked 3,4]   withdraw releases fleet-wide (retained)
  rollback --node N                   return a node to its previous model
Every command that talks to the broker takes --broker host:port (again for more brokers, tried
in order at connect), --prefix, --username, --password-file, --tls, --ca-file, --cert-file,
--key-file.
(`python -m tiers.quantize` builds and judges quantized variants of a voice.)
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from agent.core.refusal import Refused
from agent.protocol import manifest as manifests
from ota import connection, fleet, inventory, release, rollout_report, rollout_state, status
from ota import rollout as rollouts
from ota.connection import BrokerError, BrokerSettings
from ota.rollout_state import Status
from ota.safe_text import say

EXIT_HALTED = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ota",
        description=__doc__.splitlines()[0],
        epilog="\n".join(__doc__.splitlines()[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser("keygen", help="generate a signing key pair")
    keygen.add_argument("directory", type=Path)
    keygen.add_argument("--name", default="release")
    build = commands.add_parser("manifest", help="write the manifest of a model")
    build.add_argument("model", type=Path)
    build.add_argument("--release", type=int, required=True)
    build.add_argument("--version", required=True)
    build.add_argument("--expires-days", type=float, default=30.0)
    build.add_argument("--device-class", default="voice-agent")
    build.add_argument("--voice", default="default")
    build.add_argument("--notes", default="")
    build.add_argument(
        "--tier",
        type=Path,
        action="append",
        default=[],
        help="a tier variant of the model (`python -m tiers build`'s .onnx, its .onnx.json and "
        ".result.json beside it), signed with it; serve its files beside the model's",
    )
    build.add_argument("--out", type=Path, default=Path("manifest.json"))
    signing = commands.add_parser("sign", help="sign a manifest")
    signing.add_argument("manifest", type=Path)
    signing.add_argument("--key", type=Path, action="append", required=True)
    signing.add_argument("--out", type=Path, default=None)
    verifying = commands.add_parser("verify", help="check a signed manifest")
    verifying.add_argument("signed", type=Path)
    verifying.add_argument("--public-key", action="append", required=True)
    serving = commands.add_parser("serve", help="serve release files over HTTP (with Range)")
    serving.add_argument("directory", type=Path)
    serving.add_argument("--port", type=int, default=8000)
    serving.add_argument(
        "--bind",
        default=release.DEFAULT_BIND,
        help=f"address to listen on (default {release.DEFAULT_BIND}: this machine only; "
        "0.0.0.0 or the LAN address to serve the nodes)",
    )
    _fleet_commands(commands)
    _revoke_command(commands)
    return parser


def _revoke_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    revoking = commands.add_parser(
        "revoke", help="sign a revocation and publish it (retained) to the whole fleet"
    )
    revoking.add_argument("--key", type=Path, action="append", required=True)
    revoking.add_argument("--device-class", default="voice-agent")
    revoking.add_argument("--min-release", type=int, default=0, help="withdraw every release below")
    revoking.add_argument("--revoked", default="", help="releases to withdraw, comma separated")
    revoking.add_argument("--out", type=Path, default=None, help="also write the signed file")

    connection.add_arguments(revoking)


def _fleet_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The commands that talk to the broker, and the rollout's files."""
    showing = commands.add_parser("status", help="every node that announced itself")
    showing.add_argument("--group", default=None, help="only nodes in this (speak or ota) group")
    showing.add_argument("--json", action="store_true", help="JSON for scripts")
    showing.add_argument("--watch", action="store_true", help="refresh in place (Ctrl-C ends)")
    showing.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    _stale_option(showing)
    showing.add_argument(
        "--sync-timeout",
        type=float,
        default=10.0,
        help="seconds without any message before the view is shown as possibly incomplete",
    )

    offering = commands.add_parser("offer", help="offer a release to nodes")
    offering.add_argument("signed", type=Path)
    offering.add_argument("--base-url", required=True)
    target = offering.add_mutually_exclusive_group(required=True)
    target.add_argument("--node")
    target.add_argument("--group")
    target.add_argument("--all", action="store_true")
    offering.add_argument("--nodes", default="", help="nodes to wait for (with --group/--all)")
    offering.add_argument("--wait", type=float, default=600.0)

    staged = commands.add_parser("rollout", help="offer a release in waves (or --resume one)")
    staged.add_argument("signed", type=Path, nargs="?")
    staged.add_argument("--resume", type=Path, default=None, metavar="STATE_FILE")
    staged.add_argument("--base-url")
    chosen = staged.add_mutually_exclusive_group()
    chosen.add_argument("--nodes", help="node ids, comma separated")
    chosen.add_argument("--group", help="every node the inventory knows in this ota group")
    chosen.add_argument("--device-class", help="every node the inventory knows of this class")
    staged.add_argument("--waves", default="1,10,50,100", help="cumulative: percentages or counts")
    staged.add_argument("--success-threshold", type=float, default=0.9)
    staged.add_argument("--error-threshold", type=float, default=0.1)
    staged.add_argument("--soak", type=float, default=60.0, help="seconds between waves")
    staged.add_argument("--node-timeout", type=float, default=900.0, help="seconds per node")
    staged.add_argument("--rollback-on-halt", action="store_true")
    staged.add_argument("--state-file", type=Path, default=None)
    staged.add_argument("--report", type=Path, default=None, help="Markdown (and .png) path")
    staged.add_argument("--session-expiry", type=int, default=86400, help="seconds")
    _stale_option(staged)

    control = commands.add_parser("rollout-control", help="pause, resume or abort a rollout")
    control.add_argument("state_file", type=Path)
    control.add_argument("action", choices=[*rollout_state.CONTROL_COMMANDS, "show"])
    reporting = commands.add_parser("rollout-report", help="write a rollout's report again")
    reporting.add_argument("state_file", type=Path)
    reporting.add_argument("--out", type=Path, default=None)

    back = commands.add_parser("rollback", help="return a node to its previous model")
    back.add_argument("--node", required=True)
    back.add_argument("--wait", type=float, default=120.0)
    for sub in (showing, offering, staged, back):
        connection.add_arguments(sub)


def _stale_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stale-after",
        type=float,
        default=inventory.DEFAULT_STALE_AFTER,
        help="seconds without a newer state before an online node shows `stale` (0: never)",
    )


def _keygen(args: argparse.Namespace) -> int:
    path, public = release.generate_key(args.directory, args.name)
    say(f"private key: {path}\npublic key (for ota.trusted_keys): {public}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    data = release.build_manifest(
        args.model,
        args.release,
        args.version,
        expires_in=timedelta(days=args.expires_days),
        device_class=args.device_class,
        voice=args.voice,
        notes=args.notes,
        tiers=args.tier,
    )
    args.out.write_bytes(data)
    tiers = f", tiers: {', '.join(str(t.name) for t in args.tier)}" if args.tier else ""
    say(f"{args.out}: release {args.release}, {len(data)} bytes{tiers}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    keys = [release.load_private_key(k) for k in args.key]
    out = args.out or args.manifest.with_suffix(".signed.json")
    out.write_bytes(release.sign(args.manifest.read_bytes(), keys))
    say(f"{out}: signed by {len(keys)} key(s)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    trusted = {}
    for text in args.public_key:
        key = manifests.public_key_from_text(text)
        trusted[manifests.key_id(key)] = key
    checked = manifests.verify(args.signed.read_bytes(), trusted)
    say(str(checked))
    return 1 if isinstance(checked, Refused) else 0


def _serve(args: argparse.Namespace) -> int:
    if not args.directory.is_dir():
        raise ValueError(f"{args.directory}: not a directory")
    server = release.serve(args.directory, args.port, host=args.bind)
    port = server.server_address[1]
    shown = f"[{args.bind}]" if ":" in args.bind else args.bind
    say(f"serving the files of {args.directory} on http://{shown}:{port}/ (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _status(args: argparse.Namespace) -> int:
    return status.run(
        connection.settings_from_args(args),
        group=args.group,
        as_json=args.json,
        watch=args.watch,
        interval=args.interval,
        stale_after=args.stale_after,
        sync_timeout=args.sync_timeout,
    )


def _offer(args: argparse.Namespace) -> int:
    client = fleet.Fleet(connection.settings_from_args(args))
    try:
        envelope = args.signed.read_bytes()
        topic = args.node or (f"group/{args.group}" if args.group else "all")
        offer_id = f"offer-{uuid.uuid4().hex[:8]}"
        client.offer(topic, envelope, args.base_url, offer_id)
        nodes = [args.node] if args.node else [n for n in args.nodes.split(",") if n]
        if not nodes:
            return 0
        done = client.wait(offer_id, nodes, args.wait)
        return 0 if all(state in fleet.GOOD for state in done.values()) else 1
    finally:
        client.close()


def _revoke(args: argparse.Namespace) -> int:
    revoked = [int(n) for n in args.revoked.split(",") if n.strip()]
    if not revoked and args.min_release <= 0:
        raise ValueError("nothing to revoke: give --min-release and/or --revoked")
    body = release.build_revocation(args.device_class, args.min_release, revoked)
    keys = [release.load_private_key(path) for path in args.key]
    envelope = release.sign(body, keys)
    if args.out is not None:
        args.out.write_bytes(envelope)
    client = fleet.Fleet(connection.settings_from_args(args))
    try:
        client.publish_revocation(envelope)
    finally:
        client.close()
    say(f"revocation published (retained): below {args.min_release}, and {revoked or 'none'}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    client = fleet.Fleet(connection.settings_from_args(args))
    try:
        offer_id = f"rollback-{uuid.uuid4().hex[:8]}"
        client.command(args.node, {"id": offer_id, "rollback": True})
        return 0 if client.wait(offer_id, [args.node], args.wait)[args.node] == "rolled_back" else 1
    finally:
        client.close()


def _targets(args: argparse.Namespace, client: fleet.Fleet) -> tuple[list[str], str]:
    """The nodes a new rollout covers, and how they were chosen (for the report)."""
    if args.nodes:
        nodes = [n.strip() for n in args.nodes.split(",") if n.strip()]
        return nodes, f"--nodes ({len(nodes)})"
    records = client.inventory.records()
    if args.group:
        nodes = [r.node for r in records if args.group in (r.ota_groups or [])]
        silent = sum(1 for r in records if r.ota_groups is None)
        what = f"ota group {args.group}"
    else:
        nodes = [r.node for r in records if r.state.device_class == args.device_class]
        silent = sum(1 for r in records if r.state.device_class is None)
        what = f"device class {args.device_class}"
    if not nodes:
        raise ValueError(
            f"no node in the inventory ({len(records)} known) is in {what}"
            + (f"; {silent} publish no usable value of that field" if silent else "")
        )
    return nodes, f"{what} ({len(nodes)} nodes)"


def _start_rollout(args: argparse.Namespace) -> tuple[rollout_state.Rollout, Path, fleet.Fleet]:
    if args.signed is None or not args.base_url:
        raise ValueError("rollout: give SIGNED and --base-url (or --resume STATE_FILE)")
    if not (args.nodes or args.group or args.device_class):
        raise ValueError("rollout: give --nodes, --group or --device-class")
    for name in ("success_threshold", "error_threshold"):
        if not 0 <= getattr(args, name) <= 1:
            raise ValueError(f"--{name.replace('_', '-')} is a share between 0 and 1")
    envelope = args.signed.read_bytes()
    number, version, sha = release.describe(envelope)
    rollouts_id = rollouts.new_id()
    path = args.state_file or Path(f"rollout-{rollouts_id}.json")
    if path.exists():
        raise ValueError(f"{path} exists: a rollout continues with --resume {path}")
    settings = connection.settings_from_args(args)
    client = fleet.Fleet(
        settings,
        client_id=f"ota-rollout-{rollouts_id}",
        clean_start=True,
        session_expiry=args.session_expiry,
    )
    try:
        if not client.sync():
            say("warning: the inventory may be incomplete (no sync echo)", sys.stderr)
        nodes, target = _targets(args, client)
        plan = rollouts.new_rollout(
            rollouts_id,
            client,
            nodes,
            envelope,
            args.base_url,
            release=number,
            version=version,
            model_sha256=sha,
            target=target,
            waves_spec=args.waves,
            success_threshold=args.success_threshold,
            error_threshold=args.error_threshold,
            soak_s=args.soak,
            node_timeout_s=args.node_timeout,
            rollback_on_halt=args.rollback_on_halt,
            session_expiry_s=args.session_expiry,
            stale_after=args.stale_after,
        )
    except BaseException:
        client.close(forget_session=True)
        raise
    sizes = ", ".join(str(len(w.nodes)) for w in plan.waves)
    say(f"rollout {plan.id}: release {number} to {target}; waves of {sizes}; state in {path}")
    return plan, path, client


def _resume_rollout(args: argparse.Namespace) -> tuple[rollout_state.Rollout, Path, fleet.Fleet]:
    path: Path = args.resume
    plan = rollout_state.load(path)
    saved = BrokerSettings(
        host=str(plan.broker["host"]),
        port=int(plan.broker["port"]),
        prefix=str(plan.broker["prefix"]),
    )
    client = fleet.Fleet(
        connection.settings_from_args(args, fallback=saved),
        client_id=plan.client_id,
        clean_start=False,
        session_expiry=plan.session_expiry_s,
    )
    client.sync()
    kept = "kept" if client.session_present else "lost (answers come from retained state)"
    say(f"resuming rollout {plan.id} ({plan.status}); the broker session was {kept}")
    return plan, path, client


def _rollout(args: argparse.Namespace) -> int:
    plan, path, client = _resume_rollout(args) if args.resume else _start_rollout(args)
    runner = rollouts.Runner(
        client, plan, path, stale_after=args.stale_after, resumed=args.resume is not None
    )
    try:
        final = runner.run()
    except KeyboardInterrupt:
        rollout_state.save(path, plan)
        client.close()
        say(f"\ninterrupted: continue with `python -m ota rollout --resume {path}`")
        return EXIT_INTERRUPTED
    report = args.report or path.with_suffix(".md")
    markdown, png = rollout_report.write(plan, report)
    client.close(forget_session=True)
    say(f"{final}: report {markdown} (chart {png}); state {path}")
    return {Status.DONE: 0, Status.HALTED: EXIT_HALTED}.get(final, EXIT_ABORTED)


def _rollout_control(args: argparse.Namespace) -> int:
    plan = rollout_state.load(args.state_file)
    if args.action == "show":
        pending = rollout_state.read_control(args.state_file)
        waves = ", ".join(f"w{w.index + 1} {w.outcome or 'waiting'}" for w in plan.waves)
        say(f"rollout {plan.id}: {plan.status}; {waves}")
        if plan.halt_reason:
            say(f"reason: {plan.halt_reason}")
        if pending and pending[1] > (plan.control_at or 0):
            say(f"pending command: {pending[0]}")
        return 0
    if plan.status in Status.ENDED:
        raise ValueError(f"rollout {plan.id} already ended ({plan.status})")
    rollout_state.write_control(args.state_file, args.action)
    say(f"{args.action}: written for rollout {plan.id} (acted on within a second)")
    return 0


def _rollout_report(args: argparse.Namespace) -> int:
    plan = rollout_state.load(args.state_file)
    markdown, png = rollout_report.write(plan, args.out or args.state_file.with_suffix(".md"))
    say(f"{markdown} (chart {png})")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that is not UTF-8 gets escapes too
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    args = _parser().parse_args(argv)
    handlers = {
        "keygen": _keygen,
        "manifest": _manifest,
        "sign": _sign,
        "verify": _verify,
        "serve": _serve,
        "status": _status,
        "offer": _offer,
        "rollout": _rollout,
        "rollout-control": _rollout_control,
        "rollout-report": _rollout_report,
        "rollback": _rollback,
        "revoke": _revoke,
    }
    try:
        return handlers[args.command](args)
    except FileExistsError as err:
        say(f"error: {err.filename} exists: a key is never overwritten", sys.stderr)
        return EXIT_USAGE
    except (BrokerError, ValueError, OSError) as err:
        say(f"error: {err}", sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
