import platform
import subprocess
import sys

import pytest

# Allocates and frees the same eight 8 MB buffers six times, as training steps do, and prints the page faults
# of each round.
ROUNDS = """
import resource, torch
from vit.train.runtime import keep_freed_memory
print(keep_freed_memory())
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffers = [torch.empty(2 * 2**20).fill_(1.0) for _ in range(8)]
    del buffers
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
def test_freed_memory_is_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", ROUNDS], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"
    faults = [int(n) for n in out[1:]]
    assert faults[0] > 10_000  # the first round touches 64 MB of new pages
    assert sum(faults[-3:]) < faults[0] / 10  # later rounds reuse them


def test_trim_threshold_out_of_range_is_named():
    from vit.train.runtime import keep_freed_memory

    with pytest.raises(ValueError, match=r"trim_threshold must be in \[0, 2\*\*31\) bytes, got 4294967296"):
        keep_freed_memory(2**32)
