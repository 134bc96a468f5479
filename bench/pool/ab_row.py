#!/usr/bin/env python3
"""One row of a pool A/B table (bench/pool/malloc_ab.sh, pin_ab.sh) from one `kiln-bench pool --json` file:
the 1-worker job median, then per 16-worker executor the job median, kernels/s and efficiency.

  ab_row.py FILE.json PASS CONFIG [--header]
"""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
one = next(r for r in rows if r["workers"] == 1)
many = [r for r in rows if r["workers"] > 1]
if len(sys.argv) > 4 and sys.argv[4] == "--header":
    print(f"{'pass':<5} {'config':<9} {'1w job s':>9} {'1w k/s':>7}" +
          "".join(f" {r['executor'][:13]:>13} {'job s':>6} {'k/s':>6} {'eff':>6}" for r in many))
job = lambda r: r["breakdown"][0]["job_seconds"]["median"]
print(f"{sys.argv[2]:<5} {sys.argv[3]:<9} {job(one):9.3f} {one['kernels_per_second']:7.2f}" +
      "".join(f" {'':>13} {job(r):6.3f} {r['kernels_per_second']:6.2f} {r['efficiency']:6.1%}" for r in many))
