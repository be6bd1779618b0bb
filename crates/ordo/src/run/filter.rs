//! The seccomp filter of a program under `ordo run` (seccomp(2), classic BPF over `struct
//! seccomp_data`): which system calls stop for the supervisor (run/supervise.rs says why each),
//! which go on, which fail with ENOSYS (io_uring, other ABIs than the native one), and which
//! with EOPNOTSUPP (SCTP's connectx: a connect made by socket option, whose list of
//! addresses is not read here).

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
/// x32 system calls carry this bit in their number on x86_64.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Where in `struct seccomp_data` the filter reads: the number, the ABI, the arguments' low
/// words (prctl's option and value; getsockopt's level and name; sendmsg's, sendto's and
/// sendmmsg's flags), the 4th argument (connect's mark) and the 5th (sendto's destination)
/// as two 32-bit words, little-endian.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARG0_LOW: u32 = 16;
const DATA_ARG1_LOW: u32 = 16 + 8;
const DATA_ARG2_LOW: u32 = 16 + 2 * 8;
const DATA_ARG3_LOW: u32 = 16 + 3 * 8;
const DATA_ARG3_HIGH: u32 = DATA_ARG3_LOW + 4;
const DATA_ARG4_LOW: u32 = 16 + 4 * 8;
const DATA_ARG4_HIGH: u32 = DATA_ARG4_LOW + 4;

/// SCTP's socket option level and its connects by socket option (linux/sctp.h): a list of
/// addresses to associate with, set (`CONNECTX_OLD`, `CONNECTX`) or passed to getsockopt for
/// the association's id (`CONNECTX3`), as libsctp's `sctp_connectx` tries them.
const IPPROTO_SCTP: u32 = 132;
const SCTP_SOCKOPT_CONNECTX_OLD: u32 = 107;
const SCTP_SOCKOPT_CONNECTX: u32 = 110;
const SCTP_SOCKOPT_CONNECTX3: u32 = 111;

/// The filter's program, built before the fork (the child may not allocate).
pub struct Filter {
    instructions: Vec<libc::sock_filter>,
}

impl Filter {
    /// The program, for seccomp(2)'s `sock_fprog`.
    pub fn instructions(&self) -> &[libc::sock_filter] {
        &self.instructions
    }
}

/// Where a jump of the filter goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    Allow,
    Notify,
    NoSys,
    /// sendto: stopped only with a destination, unless the library checked it.
    Sendto,
    /// sendmsg, sendmmsg: stopped unless the library checked their destinations.
    Sendmsg,
    Sendmmsg,
    /// getsockopt: stopped only for SO_ERROR; SCTP's connectx refused.
    Sockopt,
    /// getsockopt of another level than SOL_SOCKET.
    SctpGetsockopt,
    /// setsockopt: SCTP's connectx refused.
    Setsockopt,
    /// Refused with EOPNOTSUPP.
    NotSupported,
    /// connect: stopped unless marked as the library's to a Unix socket.
    Connect,
    /// prctl: stopped only for PR_SET_DUMPABLE to 0.
    Prctl,
}

/// One step of the filter, before its jumps are counted.
enum Step {
    Load(u32),
    Jump {
        code: u32,
        k: u32,
        yes: To,
        no: To,
    },
    Return(u32),
    /// Where a named target is: the next step.
    Here(To),
}

/// The filter's steps as BPF: a jump's target named, its offset counted here.
fn assemble(steps: &[Step]) -> Vec<libc::sock_filter> {
    const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    const RET: u32 = libc::BPF_RET | libc::BPF_K;
    let mut at = Vec::new();
    let mut pc = 0;
    for s in steps {
        match s {
            Step::Here(to) => at.push((*to, pc)),
            _ => pc += 1,
        }
    }
    let target = |to: To, pc: usize| -> u8 {
        if to == To::Next {
            return 0;
        }
        let (_, i) = at.iter().find(|(t, _)| *t == to).expect("every target is placed");
        (i - pc - 1) as u8
    };
    let mut out = Vec::new();
    for s in steps {
        let pc = out.len();
        let (code, k, jt, jf) = match *s {
            Step::Load(offset) => (LOAD, offset, 0, 0),
            Step::Jump { code, k, yes, no } => (code, k, target(yes, pc), target(no, pc)),
            Step::Return(verdict) => (RET, verdict, 0, 0),
            Step::Here(_) => continue,
        };
        out.push(libc::sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        });
    }
    out
}

impl Filter {
    pub fn new() -> Filter {
        const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
        const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
        const JSET: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
        let checked = |yes: To, no: To| Step::Jump {
            code: JSET,
            k: ordo_attach::CHECKED_SEND as u32,
            yes,
            no,
        };
        let jeq = |k: u32, yes: To, no: To| Step::Jump { code: JEQ, k, yes, no };
        let is = |nr: libc::c_long, yes: To| jeq(nr as u32, yes, To::Next);
        let steps = [
            Step::Load(DATA_ARCH),
            jeq(AUDIT_ARCH, To::Next, To::NoSys),
            Step::Load(DATA_NR),
            Step::Jump {
                code: JGE,
                k: X32_SYSCALL_BIT,
                yes: To::NoSys,
                no: To::Next,
            },
            is(libc::SYS_connect, To::Connect),
            is(libc::SYS_sendmsg, To::Sendmsg),
            is(libc::SYS_sendmmsg, To::Sendmmsg),
            is(libc::SYS_getsockname, To::Notify),
            is(libc::SYS_getpeername, To::Notify),
            is(libc::SYS_io_uring_setup, To::NoSys),
            is(libc::SYS_getsockopt, To::Sockopt),
            is(libc::SYS_setsockopt, To::Setsockopt),
            is(libc::SYS_prctl, To::Prctl),
            jeq(libc::SYS_sendto as u32, To::Sendto, To::Allow),
            // The library's own sends, their destinations checked (ordo_attach::CHECKED_SEND):
            // a stop for each would cost a tunnel datagram of an unconnected socket, and a
            // datagram to the host's networks, a round trip to this process.
            Step::Here(To::Sendmsg),
            Step::Load(DATA_ARG2_LOW),
            checked(To::Allow, To::Notify),
            Step::Here(To::Sendmmsg),
            Step::Load(DATA_ARG3_LOW),
            checked(To::Allow, To::Notify),
            // sendto: only with a destination (a null pointer is a plain send).
            Step::Here(To::Sendto),
            Step::Load(DATA_ARG3_LOW),
            checked(To::Allow, To::Next),
            Step::Load(DATA_ARG4_LOW),
            jeq(0, To::Next, To::Notify),
            Step::Load(DATA_ARG4_HIGH),
            jeq(0, To::Allow, To::Notify),
            // connect: not the library's to a Unix socket (the attach socket, or a program's
            // AF_UNIX address), marked in the fourth argument (ordo_attach::CHECKED_CONNECT),
            // which connect does not have and the kernel ignores: a stop per connection
            // spared. Only a program that means to slip by gives it.
            Step::Here(To::Connect),
            Step::Load(DATA_ARG3_LOW),
            jeq(ordo_attach::CHECKED_CONNECT as u32, To::Next, To::Notify),
            Step::Load(DATA_ARG3_HIGH),
            jeq((ordo_attach::CHECKED_CONNECT >> 32) as u32, To::Allow, To::Notify),
            // prctl: PR_SET_DUMPABLE to 0 only, which would keep the program's memory, and
            // so its destinations, from being read here.
            Step::Here(To::Prctl),
            Step::Load(DATA_ARG0_LOW),
            jeq(libc::PR_SET_DUMPABLE as u32, To::Next, To::Allow),
            Step::Load(DATA_ARG1_LOW),
            jeq(0, To::Notify, To::Allow),
            // getsockopt: SO_ERROR stops (how a connect made from outside ended).
            Step::Here(To::Sockopt),
            Step::Load(DATA_ARG1_LOW),
            jeq(libc::SOL_SOCKET as u32, To::Next, To::SctpGetsockopt),
            Step::Load(DATA_ARG2_LOW),
            jeq(libc::SO_ERROR as u32, To::Notify, To::Allow),
            // SCTP's connects by socket option fail closed: they would associate with any
            // address of their list, the tunnel's among them, past connect's check. A
            // program then connects with connect(2), which stops.
            Step::Here(To::SctpGetsockopt),
            jeq(IPPROTO_SCTP, To::Next, To::Allow),
            Step::Load(DATA_ARG2_LOW),
            jeq(SCTP_SOCKOPT_CONNECTX3, To::NotSupported, To::Allow),
            Step::Here(To::Setsockopt),
            Step::Load(DATA_ARG1_LOW),
            jeq(IPPROTO_SCTP, To::Next, To::Allow),
            Step::Load(DATA_ARG2_LOW),
            jeq(SCTP_SOCKOPT_CONNECTX_OLD, To::NotSupported, To::Next),
            jeq(SCTP_SOCKOPT_CONNECTX, To::NotSupported, To::Allow),
            Step::Here(To::Allow),
            Step::Return(libc::SECCOMP_RET_ALLOW),
            Step::Here(To::Notify),
            Step::Return(libc::SECCOMP_RET_USER_NOTIF),
            Step::Here(To::NoSys),
            Step::Return(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
            Step::Here(To::NotSupported),
            Step::Return(libc::SECCOMP_RET_ERRNO | libc::EOPNOTSUPP as u32),
        ];
        Filter {
            instructions: assemble(&steps),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_jumps_land_on_its_verdicts() {
        let f = Filter::new();
        let last = f.instructions.len() - 1;
        for (i, ins) in f.instructions.iter().enumerate() {
            if u32::from(ins.code) & 0x07 == libc::BPF_JMP {
                assert!(i + 1 + usize::from(ins.jt) <= last, "instruction {i}: jt past the end");
                assert!(i + 1 + usize::from(ins.jf) <= last, "instruction {i}: jf past the end");
            }
        }
        let verdicts: Vec<u32> = f.instructions[last - 3..].iter().map(|i| i.k).collect();
        assert_eq!(
            verdicts,
            [
                libc::SECCOMP_RET_ALLOW,
                libc::SECCOMP_RET_USER_NOTIF,
                libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
                libc::SECCOMP_RET_ERRNO | libc::EOPNOTSUPP as u32
            ]
        );
    }
}
