//! The base and the lockdown stacked decide every syscall as the policy
//! does: checked on a classic-BPF evaluator for every syscall number of
//! the native ABI and beyond, the foreign ABIs, and the arguments the
//! conditional rules look at; and on the kernel, by the probes.

use super::*;

/// `struct seccomp_data` as a filter reads it.
struct Data {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

impl Data {
    fn word(&self, offset: u32) -> u32 {
        match offset {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction_pointer: no rule looks at it
            16..=60 if offset % 4 == 0 => {
                let arg = self.args[(offset as usize - 16) / 8];
                if offset % 8 == 0 { arg as u32 } else { (arg >> 32) as u32 }
            }
            _ => panic!("load from offset {offset}"),
        }
    }
}

/// Runs a classic BPF program (the instructions libseccomp emits) on `d`.
fn eval(prog: &[libc::sock_filter], d: &Data) -> u32 {
    let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
    loop {
        let i = prog[pc];
        pc += 1;
        let k = i.k;
        let src = if i.code & 0x08 != 0 { x } else { k };
        match i.code & 0x07 {
            0x00 => match i.code & 0xe0 {
                0x20 => a = d.word(k),
                0x00 => a = k,
                0x60 => a = mem[k as usize],
                0x80 => a = 64,
                m => panic!("ld mode {m:#x}"),
            },
            0x01 => match i.code & 0xe0 {
                0x00 => x = k,
                0x60 => x = mem[k as usize],
                0x80 => x = 64,
                m => panic!("ldx mode {m:#x}"),
            },
            0x02 => mem[k as usize] = a,
            0x03 => mem[k as usize] = x,
            0x04 => {
                a = match i.code & 0xf0 {
                    0x00 => a.wrapping_add(src),
                    0x10 => a.wrapping_sub(src),
                    0x20 => a.wrapping_mul(src),
                    0x40 => a | src,
                    0x50 => a & src,
                    0x60 => a.wrapping_shl(src),
                    0x70 => a.wrapping_shr(src),
                    0x80 => a.wrapping_neg(),
                    0xa0 => a ^ src,
                    op => panic!("alu op {op:#x}"),
                }
            }
            0x05 => {
                let taken = match i.code & 0xf0 {
                    0x00 => {
                        pc += k as usize;
                        continue;
                    }
                    0x10 => a == src,
                    0x20 => a > src,
                    0x30 => a >= src,
                    0x40 => a & src != 0,
                    op => panic!("jmp op {op:#x}"),
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            0x06 => return if i.code & 0x18 == 0x10 { a } else { k },
            _ => match i.code {
                0x07 => x = a,
                0x87 => a = x,
                c => panic!("misc {c:#x}"),
            },
        }
    }
}

/// What the kernel answers with `filters` stacked (the last loaded runs
/// first; the most restrictive action wins, the first seen among equals).
fn stacked(filters: &[&[libc::sock_filter]], d: &Data) -> u32 {
    let rank = |ret: u32| (ret & 0xffff_0000) as i32;
    let mut answer = libc::SECCOMP_RET_ALLOW;
    for f in filters.iter().rev() {
        let ret = eval(f, d);
        if rank(ret) < rank(answer) {
            answer = ret;
        }
    }
    answer
}

fn program(bytes: &[u8]) -> Vec<libc::sock_filter> {
    crate::sandbox::sys::seccomp_filters(bytes).unwrap()
}

fn nr(name: &str) -> u32 {
    ScmpSyscall::from_name(name).unwrap().as_raw_syscall() as u32
}

/// Argument vectors that tell the conditional rules' cases apart.
fn argument_cases() -> Vec<[u64; 6]> {
    let mut out = vec![[0; 6], [u64::MAX; 6], [1 << 32, 1 << 33, 1 << 34, 0, 0, 0]];
    for bit in 0..64 {
        out.push([(1u64 << bit) | libc::SIGCHLD as u64, 0, 0, 0, 0, 0]);
    }
    let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND | libc::CLONE_THREAD) as u64;
    out.push([thread, 0, 0, 0, 0, 0]);
    out.push([thread | NAMESPACE_FLAGS, 0, 0, 0, 0, 0]);
    let domains = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK, libc::AF_PACKET, libc::AF_VSOCK, 0];
    let types = [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW, libc::SOCK_SEQPACKET];
    let protocols = [0, libc::IPPROTO_TCP, libc::IPPROTO_UDP, libc::IPPROTO_ICMP, libc::NETLINK_ROUTE, libc::NETLINK_AUDIT];
    for d in domains {
        for t in types {
            for flags in [0, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC] {
                for p in protocols {
                    out.push([d as u64, (t | flags) as u64, p as u64, 0, 0, 0]);
                }
            }
        }
    }
    for p in PERSONALITIES.iter().chain(&[0x40000, 0x0040008, 0x8]) {
        out.push([*p, 0, 0, 0, 0, 0]);
    }
    out
}

#[test]
fn the_base_and_the_lockdown_stacked_decide_every_syscall_as_the_policy() {
    let policy = program(&compile().unwrap());
    let Programs { base, lockdown } = compile_programs().unwrap();
    let (base, lockdown) = (program(&base), program(&lockdown));
    assert!(lockdown.len() * 8 < policy.len(), "the lockdown ({} instructions) is the small one", lockdown.len());
    let conditional: Vec<u32> = ["clone", "socket", "socketpair", "personality"].map(nr).into();
    let all_args = argument_cases();
    let (x86_64, i386) = (0xc000_003e, 0x4000_0003);
    let numbers = (0..=600).chain([0x4000_0000, 0x4000_0001, 0x4000_003b, 0x4000_0200, u32::MAX]);
    let mut checked = 0;
    for arch in [x86_64, i386, 0] {
        for n in numbers.clone() {
            let cases = if conditional.contains(&n) { &all_args[..] } else { &all_args[..3] };
            for args in cases {
                let d = Data { nr: n, arch, args: *args };
                assert_eq!(stacked(&[&base, &lockdown], &d), eval(&policy, &d), "syscall {n} (arch {arch:#x}, args {args:x?})");
                checked += 1;
            }
        }
    }
    assert!(checked > 3 * 600 * 3);
}

#[test]
fn neither_filter_alone_is_the_policy() {
    let Programs { base, lockdown } = compile_programs().unwrap();
    let (base, lockdown) = (program(&base), program(&lockdown));
    let call = |name: &str| Data { nr: nr(name), arch: 0xc000_003e, args: [0; 6] };
    // The base lets the setup through; the lockdown alone would let setns.
    assert_eq!(eval(&base, &call("mount")), libc::SECCOMP_RET_ALLOW);
    assert_eq!(eval(&lockdown, &call("mount")), libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
    assert_eq!(eval(&lockdown, &call("setns")), libc::SECCOMP_RET_ALLOW);
    assert_eq!(stacked(&[&base, &lockdown], &call("setns")), libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
}

#[test]
fn the_kernel_stacks_them_into_the_policy() {
    let Programs { base, lockdown } = compile_programs().unwrap();
    let (base, lockdown) = (program(&base), program(&lockdown));
    let status = super::tests::probe_in_child(&[&base, &lockdown]);
    assert!(libc::WIFEXITED(status), "the probe child died: status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "probe #{} behaved wrongly under the stacked filters", libc::WEXITSTATUS(status));
    for alone in [&base, &lockdown] {
        let status = super::tests::probe_in_child(&[alone]);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 0, "one filter alone passed the probes: {status:#x}");
    }
}
