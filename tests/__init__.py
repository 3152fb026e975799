"""The test package. Imported before any conftest, so the threading defaults below reach
torch before it loads anywhere: in this process, in the xdist workers, and in every server
and worker subprocess a test starts (they inherit the environment).

One OpenMP thread by default, since the tiny models decode fastest on one; and idle OpenMP
threads sleep instead of spinning. With two pytest workers and the real pair building in
the background, spinning threads made a 2-thread forward of the real target 3x slower than
a 1-thread one beside one busy process (180 ms against 62 ms a token; 67 ms when passive).
Tests that want more threads ask torch (``tests/real/conftest.py``)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
