#!/usr/bin/env python3
"""Bins `perf script -F pid,comm,ip,sym,dso` samples of a machine-wide profile of one flow
(scripts/profile-flow.sh) and prints cores per Gbit/s by bin.

    profile-classify.py NPROC [NAME IPERF_JSON PERF_SCRIPT DAEMON_PIDS]...

DAEMON_PIDS is a comma-separated list: the processes of both tunnel ends."""
import json
import os
import sys
from collections import Counter

# A daemon sample's bin: the first of these found walking from the sampled function out
# (so a TUN write's TCP receive work stays with the TUN write).
KERNEL_CALLS = [
    ("tun write", ("tun_chr_write_iter",)),
    ("tun read", ("tun_chr_read_iter",)),
    ("udp send", ("udp_sendmsg", "udpv6_sendmsg")),
    ("udp receive", ("udp_recvmsg", "udpv6_recvmsg")),
    # AF_XDP (Outer = xdp): the wake-up that has the kernel send the TX ring (in copy mode the
    # copy and the driver's transmit happen inside it), and the one that refills the fill
    # ring; the redirect and copy of received frames run in the softirq of whoever sent them.
    ("xsk send", ("xsk_sendmsg",)),
    ("xsk receive", ("xsk_recvmsg", "xsk_poll")),
]
BINS = ["aead", "tun read", "tun write", "udp send", "udp receive", "xsk send", "xsk receive", "kernel other", "user other"]
# The bins every implementation over a TUN device and an outer path pays for.
FLOOR = BINS[:7]


def samples(path):
    """(pid, comm, frames) per sample; frames are (symbol, in_kernel), innermost first."""
    pid, comm, frames = None, None, []
    for line in open(path, errors="replace"):
        if not line.strip():
            if pid is not None:
                yield pid, comm, frames
            pid, comm, frames = None, None, []
            continue
        if not line[0].isspace():
            # "comm pid" (comm may hold spaces): the pid is the last field.
            head = line.split()
            pid, comm = int(head[-1]), " ".join(head[:-1])
            continue
        parts = line.split(None, 1)
        rest = parts[1] if len(parts) > 1 else ""
        sym = rest.split(" (")[0].split("+0x")[0]
        frames.append((sym, "kernel.kallsyms" in rest))
    if pid is not None:
        yield pid, comm, frames


# Functions of ring's ChaCha20-Poly1305 whose names say neither: local labels of its x86_64
# assembly that perf names as functions, and the constant-time tag comparison.
AEAD_HELPERS = ("process_extra_in_trailer", "poly_hash_ad_internal", "ring_core_")


def bin_of(frames):
    if not frames:
        return "user other"
    leaf = frames[0][0].lower()
    if "chacha" in leaf or "poly1305" in leaf or leaf.startswith(AEAD_HELPERS):
        return "aead"
    names = {f[0] for f in frames}
    for name, calls in KERNEL_CALLS:
        if any(c in names for c in calls):
            return name
    if any(k for _, k in frames):
        return "kernel other"
    return "user other"


def leaves(nproc, gbps, script, daemons, wanted, top=12):
    """The `top` innermost functions of a daemon's samples in bin `wanted`, as cores per
    Gbit/s: what that bin's time is spent on."""
    total, counts = 0, Counter()
    for pid, _, frames in samples(script):
        total += 1
        if pid in daemons and bin_of(frames) == wanted:
            counts[frames[0][0] if frames else "?"] += 1
    per = lambda n: nproc * n / max(total, 1) / max(gbps, 1e-9)
    return [(sym, per(n)) for sym, n in counts.most_common(top)]


def profile(nproc, gbps, script, daemons):
    """One implementation's row: cores per Gbit/s of the daemons (all bins), of each bin and
    of iperf3; the idle cores; the floor (AEAD + TUN + the outer path: UDP or AF_XDP); and the ceiling in Gbit/s, the
    rate at which `nproc` cores doing only the floor's work and iperf3's would carry it."""
    total, bins, iperf3, idle = 0, Counter(), 0, 0
    for pid, comm, frames in samples(script):
        total += 1
        if pid in daemons:
            bins[bin_of(frames)] += 1
        elif comm == "iperf3":
            iperf3 += 1
        elif comm.startswith("swapper"):
            idle += 1
    per = lambda n: nproc * n / max(total, 1) / max(gbps, 1e-9)
    by_bin = [per(bins[b]) for b in BINS]
    floor = sum(by_bin[: len(FLOOR)])
    outer = sum(per(bins[b]) for b in ("udp send", "udp receive", "xsk send", "xsk receive"))
    return {
        "outer": outer,
        "daemons": per(sum(bins.values())),
        "bins": by_bin,
        "iperf3": per(iperf3),
        "idle": nproc * idle / max(total, 1),
        "floor": floor,
        "ceiling": nproc / max(floor + per(iperf3), 1e-9),
    }


def main():
    nproc = int(sys.argv[1])
    args = sys.argv[2:]
    print("Cores per Gbit/s of one TCP flow, by where a daemon's time went (machine-wide perf samples)\n")
    print("| implementation | Gbit/s | daemons | " + " | ".join(BINS)
          + " | outer path | iperf3 | idle cores | AEAD + TUN + outer | ceiling Gbit/s | share of ceiling |")
    print("|---|" + "---|" * (len(BINS) + 8))
    for i in range(0, len(args), 4):
        name, iperf, script, pids = args[i : i + 4]
        daemons = {int(p) for p in pids.split(",") if p}
        gbps = json.load(open(iperf))["end"]["sum_received"]["bits_per_second"] / 1e9
        r = profile(nproc, gbps, script, daemons)
        print(f"| {name} | {gbps:.2f} | {r['daemons']:.3f} | " + " | ".join(f"{x:.3f}" for x in r["bins"])
              + f" | {r['outer']:.3f} | {r['iperf3']:.3f} | {r['idle']:.2f} | {r['floor']:.3f} | {r['ceiling']:.2f}"
              + f" | {gbps / r['ceiling']:.0%} |")
    detail = os.environ.get("PROFILE_BIN_DETAIL")
    if detail:
        for i in range(0, len(args), 4):
            name, iperf, script, pids = args[i : i + 4]
            daemons = {int(p) for p in pids.split(",") if p}
            gbps = json.load(open(iperf))["end"]["sum_received"]["bits_per_second"] / 1e9
            top = leaves(nproc, gbps, script, daemons, detail)
            if top:
                print(f"\n{name}, bin '{detail}', innermost functions (cores per Gbit/s):")
                for sym, c in top:
                    print(f"  {c:.4f}  {sym}")
    print("\nouter path: udp send + udp receive + xsk send + xsk receive, the kernel's share of moving"
          "\nthe datagrams (a receiver's redirect and copy run inside its sender's call).")
    print("\nceiling: the rate at which the machine's cores would carry the flow if they did only the"
          "\nunavoidable work of this run, AEAD + TUN + the outer path (UDP or AF_XDP) and iperf3's,"
          "\nand never idled: what any implementation over a TUN device and that outer path could reach"
          "\nhere, at best.")


if __name__ == "__main__":
    main()
