//! Properties of canonical JSON, fingerprints and keys, over generated inputs.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use idem_core::canonical::to_canonical_json;
use idem_core::key::KeyPart;
use idem_core::{derive_key, fingerprint};

/// Finite JSON values, nested up to a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
        "[\\x00-\\x1f\"\\\\a-z€😀]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z0-9_€😀]{0,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// The same object with its members inserted in another order (visible with
/// `serde_json/preserve_order`; CI runs these tests both ways).
fn reversed(value: &Value) -> Value {
    match value {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m.iter().rev() {
                out.insert(k.clone(), reversed(v));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(reversed).collect()),
        other => other.clone(),
    }
}

/// Changes one leaf of `value`, chosen by `pick`; `None` when it has no leaf.
fn mutate(value: &Value, pick: &mut usize) -> Option<Value> {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(changed) = mutate(v, pick) {
                    let mut m = m.clone();
                    m.insert(k.clone(), changed);
                    return Some(Value::Object(m));
                }
            }
            None
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                if let Some(changed) = mutate(v, pick) {
                    let mut a = a.clone();
                    a[i] = changed;
                    return Some(Value::Array(a));
                }
            }
            None
        }
        leaf => {
            if *pick > 0 {
                *pick -= 1;
                return None;
            }
            Some(match leaf {
                Value::Null => json!(false),
                Value::Bool(b) => json!(!b),
                Value::Number(_) => json!("a number no more"),
                Value::String(s) => json!(format!("{s}!")),
                _ => unreachable!(),
            })
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn member_order_never_changes_the_canonical_form(v in json_value()) {
        prop_assert_eq!(
            to_canonical_json(&v, &[]).unwrap(),
            to_canonical_json(&reversed(&v), &[]).unwrap()
        );
    }

    #[test]
    fn canonicalization_is_stable_and_idempotent(v in json_value()) {
        let once = to_canonical_json(&v, &[]).unwrap();
        let parsed: Value = serde_json::from_slice(&once).unwrap();
        prop_assert_eq!(to_canonical_json(&parsed, &[]).unwrap(), once);
    }

    #[test]
    fn changing_any_value_changes_the_fingerprint(v in json_value(), pick in 0usize..64) {
        let mut p = pick;
        if let Some(changed) = mutate(&v, &mut p) {
            prop_assert_ne!(fingerprint(&v, &[]).unwrap(), fingerprint(&changed, &[]).unwrap());
        }
    }

    #[test]
    fn skipped_fields_never_count_and_the_others_always_do(
        a in json_value(),
        b in json_value(),
        c in json_value(),
    ) {
        let skip: &[&[&str]] = &[&["note"]];
        let doc = |amount: &Value, note: &Value| json!({"amount": amount, "note": note});
        prop_assert_eq!(
            fingerprint(&doc(&a, &b), skip).unwrap(),
            fingerprint(&doc(&a, &c), skip).unwrap()
        );
        let same = to_canonical_json(&a, &[]).unwrap() == to_canonical_json(&c, &[]).unwrap();
        prop_assert_eq!(
            fingerprint(&doc(&a, &b), skip).unwrap() == fingerprint(&doc(&c, &b), skip).unwrap(),
            same
        );
    }

    #[test]
    fn number_forms_canonicalize_alike(n in -(1i64 << 53)..(1i64 << 53)) {
        let as_int = to_canonical_json(&n, &[]).unwrap();
        for text in [format!("{n}"), format!("{n}.0"), format!("{n}e0"), format!("{n}.000E0")] {
            let parsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&to_canonical_json(&parsed, &[]).unwrap(), &as_int, "{}", text);
        }
        prop_assert_eq!(to_canonical_json(&(n as f64), &[]).unwrap(), as_int);
    }

    #[test]
    fn escaped_and_plain_strings_canonicalize_alike(s in "\\PC{0,16}") {
        let escaped: String = s.chars().map(|c| {
            let mut units = [0u16; 2];
            c.encode_utf16(&mut units).iter().map(|u| format!("\\u{u:04x}")).collect::<String>()
        }).collect();
        let parsed: Value = serde_json::from_str(&format!("\"{escaped}\"")).unwrap();
        prop_assert_eq!(
            to_canonical_json(&parsed, &[]).unwrap(),
            to_canonical_json(&Value::String(s), &[]).unwrap()
        );
    }

    #[test]
    fn key_derivation_is_injective_over_its_parts(
        a in ("[!-~]{1,6}", "[!-~]{1,6}", prop::collection::vec("[!-~]{1,6}", 0..4)),
        b in ("[!-~]{1,6}", "[!-~]{1,6}", prop::collection::vec("[!-~]{1,6}", 0..4)),
    ) {
        let key = |(tenant, tool, parts): &(String, String, Vec<String>)| {
            let parts: Vec<KeyPart> = parts.iter().map(|p| KeyPart::new(p).unwrap()).collect();
            derive_key(tenant, tool, &parts)
        };
        prop_assert_eq!(key(&a) == key(&b), a == b);
    }

    #[test]
    fn concatenation_boundaries_never_collide(s in "[!-~]{2,12}", cut in 1usize..11) {
        let cut = cut.min(s.len() - 1);
        let (left, right) = s.split_at(cut);
        let split = derive_key("t", "tool", &[KeyPart::new(left).unwrap(), KeyPart::new(right).unwrap()]);
        let whole = derive_key("t", "tool", &[KeyPart::new(s.as_str()).unwrap()]);
        let moved = derive_key(&format!("t{left}"), "tool", &[KeyPart::new(right).unwrap()]);
        prop_assert_ne!(split, whole);
        prop_assert_ne!(split, moved);
    }
}
