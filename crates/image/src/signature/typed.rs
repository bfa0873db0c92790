//! The objects of a containers-policy.json file that carry a `"type"`
//! (requirements and signedIdentity rules): the type, and the check that
//! no key is there that the type does not know.

use crust_quote::quote;
use serde_json::{Map, Value};

pub type Res<T> = std::result::Result<T, String>;

pub struct Typed<'a> {
    pub obj: &'a Map<String, Value>,
    pub kind: &'a str,
}

impl<'a> Typed<'a> {
    pub fn parse(value: &'a Value) -> Res<Typed<'a>> {
        let obj = value.as_object().ok_or("not an object")?;
        let kind = obj
            .get("type")
            .and_then(Value::as_str)
            .ok_or("no \"type\"")?;
        Ok(Typed { obj, kind })
    }

    /// Refuses a key outside `allowed`, naming it.
    pub fn only(&self, allowed: &[&str]) -> Res<()> {
        match self.obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(format!("{}: unknown key {}", self.kind, quote(k))),
            None => Ok(()),
        }
    }
}
