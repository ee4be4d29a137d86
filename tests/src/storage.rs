//! What the storage-mount tests run inside sandboxes, whatever the provider.

/// Tries four kinds of change on the mount at `/data/ref` (create, append,
/// delete, mkdir) and prints the errno name each got (`ok` when allowed).
pub const READ_ONLY_PROBE: &str = r#"
import errno, os
def code(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return errno.errorcode[e.errno]
print(code(lambda: open('/data/ref/new.txt', 'w')), code(lambda: open('/data/ref/in/customers.csv', 'a')),
      code(lambda: os.remove('/data/ref/in/customers.csv')), code(lambda: os.mkdir('/data/ref/d')))
"#;

/// Reads `in/customers.csv` of the mount at `/data/lake`, writes
/// `out/report.txt` ("<n> customers"), and collects in `escapes` the paths
/// above the mount's prefix it could read (none, when scoping holds). The
/// caller's program goes on from there and prints what it checks.
pub const LAKE_PROGRAM_START: &str = r#"
import os, json
lake = '/data/lake'
rows = open(f'{lake}/in/customers.csv').read().splitlines()
os.makedirs(f'{lake}/out', exist_ok=True)
with open(f'{lake}/out/report.txt', 'w') as f:
    f.write(f'{len(rows) - 1} customers\n')
escapes = []
for p in ['../ab/secret', '../top', 'in/../../ab/secret']:
    try:
        open(f'{lake}/{p}').read(); escapes.append(p)
    except OSError:
        pass
"#;
