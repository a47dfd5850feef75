# s9cmp.py A.h5 B.h5 — every dataset of A and B bit for bit (session 9's check that mix_stream keeps the bits)
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
bad = [n for n in names if n not in b or a[n][()].tobytes() != b[n][()].tobytes()]
print(sys.argv[1], "vs", sys.argv[2], f"{len(names)} datasets,", "IDENTICAL" if not bad else "DIFFER: " + " ".join(bad))
sys.exit(1 if bad else 0)
