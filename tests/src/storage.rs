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
