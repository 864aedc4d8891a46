"""Soak: many consecutive run_mpi jobs on one cluster; prints the sidecar's RSS and new /dev/shm files
every 25 jobs, to catch leaks in the sidecar or libpmix.   .venv/bin/python bench/soak.py 200
"""
import glob
import json
import os
import sys
import time
from distributed import Client, LocalCluster
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from dask_pmix import run_mpi, SidecarPlugin, wait_for_plugin
def rss_of(port):
    for pid in os.listdir('/proc'):
        if not pid.isdigit(): continue
        try: cmd = open(f'/proc/{pid}/cmdline').read()
        except OSError: continue
        if 'dist/src/cli/main.js' in cmd and 'serve' in cmd and str(port) in cmd:
            for line in open(f'/proc/{pid}/status'):
                if line.startswith('VmRSS'): return int(line.split()[1])
    return None
if __name__ == '__main__':
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True, dashboard_address=None) as c, Client(c) as client:
        client.register_plugin(SidecarPlugin()); info = wait_for_plugin(client)
        port = info['url'].rsplit(':', 1)[1]
        shm0 = len(glob.glob('/dev/shm/*'))
        samples = []
        t0 = time.time()
        for i in range(int(sys.argv[1])):
            n = 2 + i % 3
            r = run_mpi(client, lambda comm: comm.allreduce(1), n=n)
            assert r == [n] * n, r
            if i % 25 == 0: samples.append((i, rss_of(port), len(glob.glob('/dev/shm/*')) - shm0))
        samples.append((int(sys.argv[1]), rss_of(port), len(glob.glob('/dev/shm/*')) - shm0))
        print(json.dumps({"jobs": int(sys.argv[1]), "seconds": round(time.time() - t0, 1), "samples(job, sidecar_rss_kb, new_shm_files)": samples}))
