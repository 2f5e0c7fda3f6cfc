# Summarizes an `ncu --page source --csv --print-source sass` export:
# warp stall samples per reason (all instructions), then the instructions
# with the most samples, each with its main reasons. `python3 stalls.py F.csv`
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr, data = rows[1], rows[2:]
col = {h: i for i, h in enumerate(hdr)}
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
num = lambda r, h: int(r[col[h]] or 0) if r[col[h]] not in ("", "-") else 0
tot = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
print(f"instructions {len(data)}, samples {tot}, executed {sum(num(r, 'Instructions Executed') for r in data)}")
agg = sorted(((sum(num(r, h) for r in data), h) for h in reasons), reverse=True)
print("by reason:", ", ".join(f"{h[6:]} {v} ({100 * v / max(tot, 1):.1f}%)" for v, h in agg if v))
# Samples per 1/16 of the code (where the time goes, by address).
n = len(data)
parts = [sum(num(r, "Warp Stall Sampling (All Samples)") for r in data[i * n // 16:(i + 1) * n // 16]) for i in range(16)]
print("by sixteenth of the code:", parts)
top = sorted(range(n), key=lambda k: -num(data[k], "Warp Stall Sampling (All Samples)"))[:60]
for k in sorted(top):
    r = data[k]
    why = sorted(((num(r, h), h[6:]) for h in reasons), reverse=True)[:3]
    print(f"{k:6d} {num(r, 'Warp Stall Sampling (All Samples)'):5d} x{num(r, 'Instructions Executed'):6d} {r[col['Source']].strip()[:60]:60s} {why}")
