# The lone process of README.md: run as
#   valgrind --tool=callgrind --zero-before=builtin_divmod --dump-before=builtin_ascii \
#     python lone_loop.py {eager,ours} fb
# and read the "summary:" line of the dump (.1): instructions for 1000 calls.
import sys, torch
torch.set_num_threads(1)
which, mode = sys.argv[1], sys.argv[2]
def tiny(x): return (x.sin()*2).sum()
f = tiny
if which == "ours":
    import aotgrad
    f = aotgrad.compile(tiny, backend="eager")
x = torch.randn(4, requires_grad=True)
def fb(): f(x).backward()
def ng():
    with torch.no_grad(): f(x)
step = fb if mode == "fb" else ng
for _ in range(50): step()
N = 1000
divmod(1, 1)
for _ in range(N): step()
ascii(1)
