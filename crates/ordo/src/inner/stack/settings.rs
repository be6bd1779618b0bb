//! What a stack interface is made with: its addresses, its MTU, and who may attach to it.

use ipnet::IpNet;

/// What a stack interface is: its addresses in the tunnel and its MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSettings {
    pub addresses: Vec<IpNet>,
    pub mtu: usize,
    /// Who may attach programs to it.
    pub attachers: Attachers,
}

/// Who may attach programs to a stack interface: its user (who started it: the daemon may
/// since have become another), root, and its guests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachers {
    pub owner: u32,
    pub guests: Guests,
}

impl Attachers {
    /// The interface's process's own user as the owner, no guests.
    pub fn own() -> Attachers {
        Attachers {
            // SAFETY: getuid cannot fail.
            owner: unsafe { libc::getuid() },
            guests: Guests::default(),
        }
    }

    /// Whether `uid` may attach, as far as is known without the user and group databases:
    /// the owner, root, a guest named by user id (see [`super::admission`] for the rest).
    pub fn admit_known(&self, uid: u32) -> bool {
        uid == self.owner || uid == 0 || self.guests.uids.contains(&uid)
    }
}

/// Users other than the interface's own whose programs may attach to it (`AttachUsers =`):
/// these users, and the members of these groups.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Guests {
    pub uids: Vec<u32>,
    pub gids: Vec<u32>,
}

impl Guests {
    pub fn is_empty(&self) -> bool {
        self.uids.is_empty() && self.gids.is_empty()
    }

    /// Whether the user `uid` is a member of a named group (its primary group or a
    /// supplementary one, as the group database says now). It may take long (NSS): never
    /// on the plane's thread ([`super::admission`]).
    pub fn in_groups(&self, uid: u32) -> bool {
        if self.gids.is_empty() {
            return false;
        }
        let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
            return false;
        };
        let Ok(name) = std::ffi::CString::new(user.name) else {
            return false;
        };
        let groups = nix::unistd::getgrouplist(&name, user.gid).unwrap_or_default();
        groups.iter().any(|g| self.gids.contains(&g.as_raw()))
    }
}
