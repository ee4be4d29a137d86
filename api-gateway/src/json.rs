//! Strict JSON: like `serde_json::Value`, but objects with a repeated key are
//! refused at any depth. Two parsers reading `{"code": "a", "code": "b"}`
//! differently is a classic smuggling trick; Warren does not guess.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON value without duplicate keys.
pub struct Strict(pub Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map(Value::Number).unwrap_or(Value::Null))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let shown: String = key.chars().take(64).collect();
                return Err(de::Error::custom(format_args!("duplicate key {shown:?}")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Parses `bytes` as one strict JSON document.
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    serde_json::from_slice::<Strict>(bytes).map(|s| s.0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn duplicates_are_refused_at_any_depth() {
        assert!(super::parse(br#"{"a":1,"a":2}"#).is_err());
        assert!(super::parse(br#"{"m":{"k":"x","k":"y"}}"#).is_err());
        assert!(super::parse(br#"[{"k":1,"k":1}]"#).is_err());
        assert_eq!(super::parse(br#"{"a":{"b":[1,"x",null,true]}}"#).unwrap()["a"]["b"][1], "x");
    }

    #[test]
    fn trailing_data_and_bad_bytes_are_refused() {
        assert!(super::parse(br#"{"a":1} {"#).is_err());
        assert!(super::parse(b"{\"a\":\"\xff\"}").is_err());
        assert!(super::parse(br#"{"a":1e999}"#).is_err());
    }
}
