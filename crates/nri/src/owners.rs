//! Which plugin set which field of which container, and the conflict rule:
//! a field (or keyed entry) set by one plugin may not be set by another in
//! the same request. A plugin that removed an entry owns its removal: only
//! that plugin may set the entry again.

use crate::api::{Field, FieldOwners, OwningPlugins, mark_for_removal, removal_target};

/// Two plugins tried to set the same thing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plugins {plugin:?} and {other:?} both tried to set {what}")]
pub struct Conflict {
    /// The plugin asking now.
    pub plugin: String,
    /// The plugin that set (or removed) it before.
    pub other: String,
    /// NRI's field name, followed by the entry key for keyed fields
    /// ("Env FOO", "MemLimit").
    pub what: String,
}

#[derive(Default, Debug)]
pub(crate) struct Owners(pub OwningPlugins);

impl Owners {
    fn of(&mut self, id: &str) -> &mut FieldOwners {
        self.0.owners.entry(id.to_string()).or_default()
    }

    fn conflict(field: Field, key: Option<&str>, plugin: &str, other: &str) -> Conflict {
        let what = match key {
            Some(k) => format!("{} {}", field.name(), crate::quote(k)),
            None => field.name().to_string(),
        };
        Conflict {
            plugin: plugin.to_string(),
            other: other.to_string(),
            what,
        }
    }

    /// Claims a simple field for `plugin`.
    pub fn claim(&mut self, id: &str, field: Field, plugin: &str) -> Result<(), Conflict> {
        let f = self.of(id);
        if let Some(other) = f.simple.get(&(field as i32)) {
            match removal_target(other) {
                Some(clearer) if clearer == plugin => {}
                Some(clearer) => return Err(Self::conflict(field, None, plugin, clearer)),
                None => return Err(Self::conflict(field, None, plugin, other)),
            }
        }
        f.simple.insert(field as i32, plugin.to_string());
        Ok(())
    }

    /// Claims one entry (by key) of a keyed field for `plugin`.
    pub fn claim_entry(
        &mut self,
        id: &str,
        field: Field,
        key: &str,
        plugin: &str,
    ) -> Result<(), Conflict> {
        let m = self.of(id).compound.entry(field as i32).or_default();
        if let Some(other) = m.owners.get(key) {
            match removal_target(other) {
                Some(clearer) if clearer == plugin => {}
                Some(clearer) => return Err(Self::conflict(field, Some(key), plugin, clearer)),
                None => return Err(Self::conflict(field, Some(key), plugin, other)),
            }
        }
        m.owners.insert(key.to_string(), plugin.to_string());
        Ok(())
    }

    /// Records that `plugin` removed a simple field.
    pub fn clear(&mut self, id: &str, field: Field, plugin: &str) {
        self.of(id)
            .simple
            .insert(field as i32, mark_for_removal(plugin));
    }

    /// Records that `plugin` removed one entry of a keyed field.
    pub fn clear_entry(&mut self, id: &str, field: Field, key: &str, plugin: &str) {
        self.of(id)
            .compound
            .entry(field as i32)
            .or_default()
            .owners
            .insert(key.to_string(), mark_for_removal(plugin));
    }

    /// Hooks only accumulate: every plugin may add some ("a,b").
    pub fn accumulate(&mut self, id: &str, field: Field, plugin: &str) {
        let f = self.of(id);
        let v = match f.simple.get(&(field as i32)) {
            Some(old) => format!("{old},{plugin}"),
            None => plugin.to_string(),
        };
        f.simple.insert(field as i32, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_plugin_conflicts_on_simple_and_keyed_fields() {
        let mut o = Owners::default();
        o.claim("c", Field::MemLimit, "00-a").unwrap();
        let e = o.claim("c", Field::MemLimit, "10-b").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"plugins "10-b" and "00-a" both tried to set MemLimit"#
        );
        o.claim_entry("c", Field::Env, "FOO", "00-a").unwrap();
        o.claim_entry("c", Field::Env, "BAR", "10-b").unwrap();
        let e = o.claim_entry("c", Field::Env, "FOO", "10-b").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"plugins "10-b" and "00-a" both tried to set Env FOO"#
        );
        // other containers are independent
        o.claim("d", Field::MemLimit, "10-b").unwrap();
    }

    #[test]
    fn remover_may_set_again_others_may_not() {
        let mut o = Owners::default();
        o.clear_entry("c", Field::Mounts, "/data", "00-a");
        o.claim_entry("c", Field::Mounts, "/data", "00-a").unwrap();
        let mut o = Owners::default();
        o.clear_entry("c", Field::Mounts, "/data", "00-a");
        let e = o
            .claim_entry("c", Field::Mounts, "/data", "10-b")
            .unwrap_err();
        assert_eq!(e.other, "00-a");
        o.clear("c", Field::Args, "00-a");
        o.claim("c", Field::Args, "00-a").unwrap();
    }

    #[test]
    fn hooks_accumulate() {
        let mut o = Owners::default();
        o.accumulate("c", Field::OciHooks, "00-a");
        o.accumulate("c", Field::OciHooks, "10-b");
        assert_eq!(
            o.0.owners["c"].simple[&(Field::OciHooks as i32)],
            "00-a,10-b"
        );
    }
}
