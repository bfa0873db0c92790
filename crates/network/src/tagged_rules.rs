//! The nat rules CNI plugins tagged for one attachment, found and removed
//! when a plugin's own DEL cannot find them any more.
//!
//! The reference plugins comment each iptables rule they make for a pod
//! with `name: "<network>" id: "<container id>"` (bridge and ptp ipMasq;
//! portmap prefixes `dnat `). The bridge plugin's DEL finds its masquerade
//! chain through the pod's addresses on the interface inside the netns: a
//! DEL cut short after it deleted the interface (the daemon killed
//! mid-DEL) leaves the chain `CNI-<hash>` and its POSTROUTING jump behind,
//! and every later DEL finds no address and leaves them too (upstream
//! keeps it so: containernetworking/plugins#810). After a DEL that may
//! follow such a one, [`Cni::del`](crate::Cni::del) removes what carries
//! the attachment's tag, exactly: the rules whose comment is the tag, then
//! the `CNI-` chains that held nothing else and nothing jumps to any more.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::Error;
use crate::exec::run_tool;

/// The iptables tools of one address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    fn save(self) -> &'static str {
        match self {
            Family::V4 => "iptables-save",
            Family::V6 => "ip6tables-save",
        }
    }

    fn restore(self) -> &'static str {
        match self {
            Family::V4 => "iptables-restore",
            Family::V6 => "ip6tables-restore",
        }
    }
}

/// The comments the plugins put on an attachment's rules (Go's `%q` of
/// names that need no escaping, as CNI names and container IDs are).
pub(crate) fn tags(network: &str, container_id: &str) -> Vec<String> {
    let tag = format!("name: \"{network}\" id: \"{container_id}\"");
    vec![format!("dnat {tag}"), tag]
}

/// What to remove from the nat table.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Removal {
    /// The tagged rules, as `iptables-save` printed them (`-A <chain> ...`).
    pub rules: Vec<String>,
    /// User chains named `CNI-...` left empty and unreferenced by that.
    pub chains: Vec<String>,
}

impl Removal {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.chains.is_empty()
    }

    /// An `iptables-restore --noflush` input that removes it all at once.
    pub fn restore_script(&self) -> String {
        let mut script = String::from("*nat\n");
        for rule in &self.rules {
            // `-A <chain> <spec>` deletes as `-D <chain> <spec>`.
            script.push_str("-D ");
            script.push_str(&rule[3..]);
            script.push('\n');
        }
        for chain in &self.chains {
            script.push_str(&format!("-X {chain}\n"));
        }
        script.push_str("COMMIT\n");
        script
    }
}

/// One `-A` line of `iptables-save`, split as the shell would (that is how
/// it quotes).
struct Rule<'a> {
    line: &'a str,
    chain: String,
    comment: Option<String>,
    /// `-j`/`-g` target.
    target: Option<String>,
}

fn parse_rule(line: &str) -> Option<Rule<'_>> {
    let words = shlex::split(line.strip_prefix("-A ")?)?;
    let chain = words.first()?.clone();
    let after = |flag: &str| {
        words
            .windows(2)
            .find(|w| w[0] == flag)
            .map(|w| w[1].clone())
    };
    Some(Rule {
        line,
        chain,
        comment: after("--comment"),
        target: after("-j").or_else(|| after("-g")),
    })
}

/// The rules of `iptables-save -t nat` output tagged with one of `tags`,
/// and the chains to delete after them: user chains named `CNI-...` that
/// held only tagged rules (or none, when a tagged rule jumps there) and
/// that no other rule jumps to. A line that does not parse is kept, and so
/// is any chain it is in or names.
pub(crate) fn plan(save: &str, tags: &[String]) -> Removal {
    let mut user_chains = BTreeSet::new();
    // chain -> (tagged rules in it, other rules in it)
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut kept_targets = BTreeSet::new();
    let mut tagged_targets = BTreeSet::new();
    let mut removal = Removal::default();
    for line in save.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            // `:<chain> <policy> [packets:bytes]`; user chains have "-".
            let mut parts = decl.split_whitespace();
            if let (Some(chain), Some("-")) = (parts.next(), parts.next()) {
                user_chains.insert(chain.to_string());
            }
            continue;
        }
        if !line.starts_with("-A ") {
            continue;
        }
        let Some(rule) = parse_rule(line) else {
            // Unparseable: keep it, and whatever it may name.
            for word in line.split_whitespace() {
                kept_targets.insert(word.to_string());
                counts.entry(word.to_string()).or_default().1 += 1;
            }
            continue;
        };
        let tagged = rule.comment.as_ref().is_some_and(|c| tags.contains(c));
        let entry = counts.entry(rule.chain.clone()).or_default();
        if tagged {
            entry.0 += 1;
            tagged_targets.extend(rule.target.clone());
            removal.rules.push(rule.line.to_string());
        } else {
            entry.1 += 1;
            kept_targets.extend(rule.target.clone());
        }
    }
    removal.chains = user_chains
        .into_iter()
        .filter(|chain| chain.starts_with("CNI-") && !kept_targets.contains(chain))
        .filter(|chain| {
            let (tagged, other) = counts.get(chain).copied().unwrap_or_default();
            other == 0 && (tagged > 0 || tagged_targets.contains(chain))
        })
        .collect();
    removal
}

/// Removes the nat rules tagged for this attachment in `family`, and the
/// chains they leave empty. Returns how many rules and chains went. A node
/// without the iptables tools (or a nat table it can read) has none to
/// remove; rules found but not removed are an error (the DEL stays owed).
pub(crate) async fn remove(
    family: Family,
    network: &str,
    container_id: &str,
    timeout: Duration,
) -> Result<usize, Error> {
    let save = match run_tool(family.save(), &["-t", "nat"], b"", timeout).await {
        Ok(Some(save)) => save,
        Ok(None) => {
            tracing::debug!("{} not installed: no tagged rules to remove", family.save());
            return Ok(0);
        }
        // No nat table to read (a legacy node without the module, say):
        // nothing to find, and no reason to keep the pod's DEL owed.
        Err(e) => {
            tracing::warn!(container_id, "cannot look for nat rules left behind: {e}");
            return Ok(0);
        }
    };
    let removal = plan(
        &String::from_utf8_lossy(&save),
        &tags(network, container_id),
    );
    if removal.is_empty() {
        return Ok(0);
    }
    let script = removal.restore_script();
    // --noflush: only these changes, applied together; -w: wait for the
    // xtables lock a plugin may hold (legacy backend).
    run_tool(
        family.restore(),
        &["-w", "5", "--noflush"],
        script.as_bytes(),
        timeout,
    )
    .await?;
    tracing::info!(
        container_id,
        network,
        rules = removal.rules.len(),
        chains = removal.chains.len(),
        "removed nat rules the CNI plugins left behind"
    );
    Ok(removal.rules.len() + removal.chains.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123abcd";
    const OTHER: &str = "0123abcde";

    fn save() -> String {
        format!(
            r#"# Generated by iptables-nft-save v1.8.9 (nf_tables) on Tue Nov 24 17:00:00 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:CNI-0a1b2c3d4e5f60718293a4b5 - [0:0]
:CNI-ffeeddccbbaa998877665544 - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-DN-0a1b2c3d4e5f60718293a - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A POSTROUTING -s 10.88.0.5/32 -m comment --comment "name: \"crust\" id: \"{ID}\"" -j CNI-0a1b2c3d4e5f60718293a4b5
-A POSTROUTING -s 10.88.0.6/32 -m comment --comment "name: \"crust\" id: \"{OTHER}\"" -j CNI-ffeeddccbbaa998877665544
-A CNI-0a1b2c3d4e5f60718293a4b5 -d 10.88.0.0/16 -m comment --comment "name: \"crust\" id: \"{ID}\"" -j ACCEPT
-A CNI-0a1b2c3d4e5f60718293a4b5 ! -d 224.0.0.0/4 -m comment --comment "name: \"crust\" id: \"{ID}\"" -j MASQUERADE
-A CNI-ffeeddccbbaa998877665544 -d 10.88.0.0/16 -m comment --comment "name: \"crust\" id: \"{OTHER}\"" -j ACCEPT
-A CNI-ffeeddccbbaa998877665544 ! -d 224.0.0.0/4 -m comment --comment "name: \"crust\" id: \"{OTHER}\"" -j MASQUERADE
-A CNI-HOSTPORT-DNAT -p tcp -m comment --comment "dnat name: \"crust\" id: \"{ID}\"" -m multiport --dports 8080 -j CNI-DN-0a1b2c3d4e5f60718293a
-A CNI-DN-0a1b2c3d4e5f60718293a -p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.88.0.5:80
-A KUBE-POSTROUTING -m comment --comment "name: \"crust\" id: \"{ID}\" and more" -j RETURN
COMMIT
"#
        )
    }

    #[test]
    fn only_the_attachments_rules_and_emptied_chains_are_removed() {
        let removal = plan(&save(), &tags("crust", ID));
        assert_eq!(
            removal.rules,
            save()
                .lines()
                .filter(|l| l.contains(&format!("id: \\\"{ID}\\\"\"")))
                .map(str::to_string)
                .collect::<Vec<_>>()
        );
        assert_eq!(removal.rules.len(), 4, "{removal:#?}");
        // portmap's DN chain holds an untagged rule: not ours to drop; the
        // shared chains and the other pod's stay.
        assert_eq!(removal.chains, ["CNI-0a1b2c3d4e5f60718293a4b5"]);
        let script = removal.restore_script();
        assert!(script.starts_with("*nat\n-D POSTROUTING -s 10.88.0.5/32 -m comment"));
        assert!(script.ends_with("-X CNI-0a1b2c3d4e5f60718293a4b5\nCOMMIT\n"));
    }

    #[test]
    fn a_chain_whose_jump_is_gone_already_is_removed_too() {
        // A teardown cut short after deleting the POSTROUTING jump.
        let text: String = save()
            .lines()
            .filter(|l| !l.starts_with("-A POSTROUTING -s 10.88.0.5/32"))
            .map(|l| format!("{l}\n"))
            .collect();
        let removal = plan(&text, &tags("crust", ID));
        assert_eq!(removal.rules.len(), 3);
        assert_eq!(removal.chains, ["CNI-0a1b2c3d4e5f60718293a4b5"]);
        // And one emptied already, with its jump still there.
        let text: String = save()
            .lines()
            .filter(|l| !l.starts_with("-A CNI-0a1b2c3d4e5f60718293a4b5"))
            .map(|l| format!("{l}\n"))
            .collect();
        let removal = plan(&text, &tags("crust", ID));
        assert_eq!(removal.rules.len(), 2);
        assert_eq!(removal.chains, ["CNI-0a1b2c3d4e5f60718293a4b5"]);
    }

    #[test]
    fn a_chain_something_else_jumps_to_stays() {
        let text = save().replace(
            "COMMIT",
            "-A OUTPUT -j CNI-0a1b2c3d4e5f60718293a4b5\nCOMMIT",
        );
        let removal = plan(&text, &tags("crust", ID));
        assert_eq!(removal.rules.len(), 4);
        assert!(removal.chains.is_empty(), "{removal:#?}");
    }

    #[test]
    fn nothing_tagged_nothing_removed() {
        assert!(plan(&save(), &tags("crust", "feed")).is_empty());
        assert!(plan(&save(), &tags("other", ID)).is_empty());
        assert!(plan("", &tags("crust", ID)).is_empty());
        // An unterminated quote does not parse: kept.
        let text = format!(
            ":CNI-x - [0:0]\n-A CNI-x -m comment --comment \"name: \\\"crust\\\" id: \\\"{ID}\\\"\n"
        );
        assert!(plan(&text, &tags("crust", ID)).is_empty());
    }
}
