# Records a command run on a pseudo-terminal as an asciicast v2 file (how
# docs/snapdemo-replay.svg was made, see README.md):
#   python3 docs/tools/record.py COLS ROWS OUT.cast CMD...
#   npx svg-term-cli --in OUT.cast --out OUT.svg --window --width COLS --height ROWS
import os, pty, sys, time, json, fcntl, termios, struct, select
cols, rows = int(sys.argv[1]), int(sys.argv[2]); out = sys.argv[3]; cmd = sys.argv[4:]
pid, fd = pty.fork()
if pid == 0:
    os.environ['TERM'] = 'xterm-256color'
    os.execvp(cmd[0], cmd)
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', rows, cols, 0, 0))
start = time.time(); events = []
while True:
    r, _, _ = select.select([fd], [], [], 0.5)
    if fd in r:
        try: data = os.read(fd, 65536)
        except OSError: break
        if not data: break
        events.append([round(time.time() - start, 3), "o", data.decode('utf-8', 'replace')])
with open(out, 'w') as f:
    f.write(json.dumps({"version": 2, "width": cols, "height": rows, "timestamp": int(start), "env": {"TERM": "xterm-256color", "SHELL": "/bin/bash"}}) + "\n")
    for e in events: f.write(json.dumps(e) + "\n")
os.waitpid(pid, 0)
