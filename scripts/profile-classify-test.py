#!/usr/bin/env python3
"""Checks profile-classify.py's bins, floor and ceiling on a made-up `perf script` text whose
answer is known. Run by `make unit`."""
import importlib.util
import os
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("classify", os.path.join(here, "profile-classify.py"))
classify = importlib.util.module_from_spec(spec)
spec.loader.exec_module(classify)


def sample(comm, pid, frames):
    """One sample as `perf script -F pid,comm,ip,sym,dso` prints it: frames innermost first,
    each (symbol, in_kernel)."""
    lines = [f"{comm} {pid}"]
    for sym, kernel in frames:
        dso = "([kernel.kallsyms])" if kernel else "(/usr/local/bin/ordo)"
        lines.append(f"\t    ffffffff81000000 {sym}+0x10 {dso}")
    return "\n".join(lines) + "\n\n"


AEAD = [("ring_core_0_17_14__chacha20_poly1305_seal_avx2", False)]
TUN_WRITE = [("_copy_from_iter", True), ("tun_chr_write_iter", True), ("__GI___writev", False)]
UDP_SEND = [("_copy_from_iter", True), ("udp_sendmsg", True), ("__sendmmsg", False)]
XSK_SEND = [("memcpy", True), ("xsk_sendmsg", True), ("__sendto", False)]
WAKE = [("_raw_spin_unlock_irqrestore", True), ("try_to_wake_up", True)]
USER = [("ordo::device::offload::sum16_avx2", False)]

# ring's assembly labels and tag comparison are the AEAD's too.
AEAD_HELPER = [("process_extra_in_trailer", False)]
TAG = [("ring_core_0_17_14__CRYPTO_memcmp", False)]

# 100 samples on 2 CPUs at 5 Gbit/s: daemon pid 7 (and 8): 40 AEAD, 10 TUN write, 6 UDP
# send, 4 AF_XDP send, 5 other kernel, 5 user; iperf3 10; idle 20.
text = (
    sample("ordo-queue0", 7, AEAD) * 28
    + sample("ordo-queue0", 7, AEAD_HELPER)
    + sample("ordo-queue0", 7, TAG)
    + sample("ordo-queue1", 8, AEAD) * 10
    + sample("ordo-queue1", 8, TUN_WRITE) * 10
    + sample("ordo-queue0", 7, UDP_SEND) * 6
    + sample("ordo-queue0", 7, XSK_SEND) * 4
    + sample("ordo-queue0", 7, WAKE) * 5
    + sample("ordo-queue1", 8, USER) * 5
    + sample("iperf3", 9, [("_copy_to_iter", True)]) * 10
    + sample("swapper", 0, [("pv_native_safe_halt", True)]) * 20
)
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write(text)
try:
    r = classify.profile(2, 5.0, f.name, {7, 8})
finally:
    os.unlink(f.name)

per = lambda n: 2 * n / 100 / 5.0  # cores per Gbit/s of n samples
bins = dict(zip(classify.BINS, r["bins"]))
checks = [
    ("aead", bins["aead"], per(40)),
    ("tun write", bins["tun write"], per(10)),
    ("udp send", bins["udp send"], per(6)),
    ("xsk send", bins["xsk send"], per(4)),
    ("kernel other", bins["kernel other"], per(5)),
    ("user other", bins["user other"], per(5)),
    ("daemons", r["daemons"], per(70)),
    ("iperf3", r["iperf3"], per(10)),
    ("idle cores", r["idle"], 0.4),
    ("outer", r["outer"], per(10)),
    ("floor", r["floor"], per(60)),
    # 2 cores / (0.24 + 0.04 cores per Gbit/s)
    ("ceiling", r["ceiling"], 2 / (per(60) + per(10))),
]
bad = [f"{name}: {got} != {want}" for name, got, want in checks if abs(got - want) > 1e-9]
if bad:
    sys.exit("profile-classify: " + "; ".join(bad))
print(f"profile-classify: {len(checks)} figures as expected (ceiling {r['ceiling']:.2f} Gbit/s)")
