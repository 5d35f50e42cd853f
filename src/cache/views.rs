//! The views of one cluster that passes read: its namespaces, the copies
//! of each kind watched, its Roles while RoleBindings are copied, and
//! which of them have their first full list.

use std::collections::BTreeMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::api::kinds::{Kind, MAX_KINDS};
use crate::cache::index::{CopyIndex, NamespaceInfo};
use crate::cache::roles::RoleIndex;

/// The in-memory views of one cluster. Lock order: `namespaces` before
/// `copies` before `roles` (a plan reads them all); see
/// `controller::state::Shared` for where they stand among the
/// controller's locks.
pub(crate) struct Views {
    pub(crate) namespaces: RwLock<BTreeMap<String, NamespaceInfo>>,
    /// By kind: the copies cluster-wide (only of kinds being watched).
    copies: Box<[RwLock<CopyIndex>]>,
    /// Every Role, while RoleBindings are copied (their copies are judged
    /// by the Roles they bind); empty otherwise.
    pub(crate) roles: RwLock<RoleIndex>,
    pub(crate) synced: Synced,
}

impl Default for Views {
    fn default() -> Self {
        Self {
            namespaces: RwLock::default(),
            copies: (0..MAX_KINDS).map(|_| RwLock::default()).collect(),
            roles: RwLock::default(),
            synced: Synced::default(),
        }
    }
}

impl Views {
    pub(crate) fn copies(&self, kind: Kind) -> &RwLock<CopyIndex> {
        &self.copies[kind.index()]
    }
}

/// Which caches have their first full list.
pub(crate) struct Synced {
    rules: AtomicBool,
    namespaces: AtomicBool,
    /// By kind: false while the kind's copy watch has yet to list; true
    /// once it has, or while the kind is not watched (nothing to wait for).
    copies: [AtomicBool; MAX_KINDS],
    /// True once the Role watch has listed, false while it has yet to or
    /// is not running: RoleBinding copies are never judged without it.
    roles: AtomicBool,
    /// Rung on every change, for [`Synced::wait_all`].
    changed: tokio::sync::Notify,
}

impl Default for Synced {
    fn default() -> Self {
        let copies = [const { AtomicBool::new(true) }; MAX_KINDS];
        // The built-in kinds are watched from the start, unless disabled.
        for kind in Kind::builtin() {
            copies[kind.index()].store(false, Ordering::Release);
        }
        Self {
            rules: AtomicBool::new(false),
            namespaces: AtomicBool::new(false),
            copies,
            roles: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }
}

impl Synced {
    /// The caches every pass needs: rules, namespaces, built-in kinds'
    /// copies (another kind's copy watch starts with its first rule).
    pub(crate) fn all(&self) -> bool {
        self.rules.load(Ordering::Acquire)
            && self.namespaces.load(Ordering::Acquire)
            && Kind::builtin().all(|kind| self.copies_of(kind))
    }

    pub(crate) fn copies_of(&self, kind: Kind) -> bool {
        self.copies[kind.index()].load(Ordering::Acquire)
    }

    pub(crate) fn set_copies_of(&self, kind: Kind, listed: bool) {
        self.copies[kind.index()].store(listed, Ordering::Release);
        self.changed.notify_waiters();
    }

    pub(crate) fn roles(&self) -> bool {
        self.roles.load(Ordering::Acquire)
    }

    pub(crate) fn set_roles(&self, listed: bool) {
        self.roles.store(listed, Ordering::Release);
        self.changed.notify_waiters();
    }

    pub(crate) fn set_rules_listed(&self) {
        self.rules.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    pub(crate) fn set_namespaces_listed(&self) {
        self.namespaces.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Returns once every cache a pass needs has its first list.
    pub(crate) async fn wait_all(&self) {
        loop {
            // Registered before the check, so that no change in between is missed.
            let changed = self.changed.notified();
            if self.all() {
                return;
            }
            changed.await;
        }
    }

    /// What has not been listed yet, for messages.
    pub(crate) fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.rules.load(Ordering::Acquire) {
            missing.push("the CopyratorRules".to_owned());
        }
        if !self.namespaces.load(Ordering::Acquire) {
            missing.push("the namespaces".to_owned());
        }
        for kind in Kind::all() {
            if !self.copies_of(kind) {
                missing.push(format!("the {kind} copies"));
            }
        }
        missing
    }
}
