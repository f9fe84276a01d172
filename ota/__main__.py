"""`python -m ota`: the fleet operator's tool for model updates.

  keygen DIR                          a key pair; prints the public key for ota.trusted_keys
  manifest MODEL.onnx --release N --version V [--expires-days D] [--device-class C] [--notes T]
  sign MANIFEST --key KEY [--key KEY2]
  verify SIGNED --public-key B64 [...]
  serve DIR [--port 8000]             releases over HTTP with Range, for a LAN
  offer SIGNED --base-url URL (--node N | --group G | --all) [--broker H:P] [--wait S]
  rollout SIGNED --base-url URL --nodes N1,N2,... [--canary 0.2] [--threshold 0.1]
  rollback --node N                   return a node to its previous model
(`python -m ota.quantize` builds and judges quantized variants of a voice.)
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from agent import manifest as manifests
from ota import fleet, release


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ota", description=__doc__.splitlines()[0])
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
    build.add_argument("--out", type=Path, default=Path("manifest.json"))
    signing = commands.add_parser("sign", help="sign a manifest")
    signing.add_argument("manifest", type=Path)
    signing.add_argument("--key", type=Path, action="append", required=True)
    signing.add_argument("--out", type=Path, default=None)
    verifying = commands.add_parser("verify", help="check a signed manifest")
    verifying.add_argument("signed", type=Path)
    verifying.add_argument("--public-key", action="append", required=True)
    serving = commands.add_parser("serve", help="serve releases over HTTP (with Range)")
    serving.add_argument("directory", type=Path)
    serving.add_argument("--port", type=int, default=8000)
    offering = commands.add_parser("offer", help="offer a release to nodes")
    offering.add_argument("signed", type=Path)
    offering.add_argument("--base-url", required=True)
    target = offering.add_mutually_exclusive_group(required=True)
    target.add_argument("--node")
    target.add_argument("--group")
    target.add_argument("--all", action="store_true")
    offering.add_argument("--nodes", default="", help="nodes to wait for (with --group/--all)")
    offering.add_argument("--wait", type=float, default=600.0)
    staged = commands.add_parser("rollout", help="canaries first, then the rest")
    staged.add_argument("signed", type=Path)
    staged.add_argument("--base-url", required=True)
    staged.add_argument("--nodes", required=True)
    staged.add_argument("--canary", type=float, default=0.2)
    staged.add_argument("--threshold", type=float, default=0.1)
    staged.add_argument("--wait", type=float, default=600.0)
    back = commands.add_parser("rollback", help="return a node to its previous model")
    back.add_argument("--node", required=True)
    for sub in (offering, staged, back):
        sub.add_argument("--broker", default="127.0.0.1:1883")
        sub.add_argument("--prefix", default="voice")
    return parser


def _keygen(args: argparse.Namespace) -> int:
    path, public = release.generate_key(args.directory, args.name)
    print(f"private key: {path}\npublic key (for ota.trusted_keys): {public}")
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
    )
    args.out.write_bytes(data)
    print(f"{args.out}: release {args.release}, {len(data)} bytes")
    return 0


def _sign(args: argparse.Namespace) -> int:
    keys = [release.load_private_key(k) for k in args.key]
    out = args.out or args.manifest.with_suffix(".signed.json")
    out.write_bytes(release.sign(args.manifest.read_bytes(), keys))
    print(f"{out}: signed by {len(keys)} key(s)")
    return 0


def _verify(args: argparse.Namespace) -> int:
    trusted = {}
    for text in args.public_key:
        key = manifests.public_key_from_text(text)
        trusted[manifests.key_id(key)] = key
    checked = manifests.verify(args.signed.read_bytes(), trusted)
    print(checked)
    return 1 if isinstance(checked, manifests.Refusal) else 0


def _serve(args: argparse.Namespace) -> int:
    server = release.serve(args.directory, args.port)
    print(f"serving {args.directory} on port {args.port} (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def _with_fleet(args: argparse.Namespace) -> int:
    host, _, port = args.broker.partition(":")
    client = fleet.Fleet(host, int(port or 1883), args.prefix)
    try:
        if args.command == "rollback":
            offer_id = f"rollback-{uuid.uuid4().hex[:8]}"
            client.command(args.node, {"id": offer_id, "rollback": True})
            return 0 if client.wait(offer_id, [args.node], 120)[args.node] == "rolled_back" else 1
        envelope = args.signed.read_bytes()
        if args.command == "rollout":
            nodes = [n for n in args.nodes.split(",") if n]
            result = fleet.rollout(
                client,
                nodes,
                envelope,
                args.base_url,
                canary_share=args.canary,
                failure_threshold=args.threshold,
                timeout=args.wait,
            )
            print(result)
            return 1 if result.halted else 0
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


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code."""
    args = _parser().parse_args(argv)
    handlers = {
        "keygen": _keygen,
        "manifest": _manifest,
        "sign": _sign,
        "verify": _verify,
        "serve": _serve,
    }
    return handlers.get(args.command, _with_fleet)(args)


if __name__ == "__main__":
    sys.exit(main())
