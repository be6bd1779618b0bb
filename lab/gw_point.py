"""One many-tunnels point of lab/lab.sh as a results.jsonl line: the iperf3 flows' aggregate
throughput, the gateways' daemons' CPU, and each CPU's shares from /proc/stat."""
import glob
import json
import sys

# window: seconds between the two CPU readings (the flows' start to the last one's end).
# jiffies: each gateway's daemons' CPU time over the window, in clock ticks, "GW1,GW2".
impl, kind, n, window, jiffies, ticks, logdir, before = sys.argv[1:9]
gateways = [int(j) / int(ticks) / float(window) for j in jiffies.split(",")]
bits = 0.0
for f in glob.glob(f"{logdir}/flow-*.json"):
    try:
        bits += json.load(open(f))["end"]["sum_received"]["bits_per_second"]
    except (ValueError, KeyError):
        pass  # a flow that failed counts nothing


def stat(text):
    rows = []
    for line in text.splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:9]]
            rows.append((v[0] + v[1], v[2], v[5] + v[6], v[3] + v[4], sum(v)))
    return rows


cpu = []
for i, (b, a) in enumerate(zip(stat(before), stat(open("/proc/stat").read()))):
    d = [x - y for x, y in zip(a, b)]
    t = max(d[4], 1)
    cpu.append({"cpu": i, "user": d[0] / t, "system": d[1] / t, "softirq": d[2] / t, "idle": d[3] / t})
print(json.dumps({
    "impl": impl, "clients": int(n), "kind": kind, "server": None,
    "report": {"up_gbit": bits / 1e9, "down_gbit": 0.0,
               "server_cores": sum(gateways), "gateway_cores": gateways, "machine_cpu": cpu},
}))
