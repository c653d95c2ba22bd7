//! The canonical form, case by case: RFC 8785's own examples, and every serde shape.

use super::text::compare_utf16;
use super::*;
use serde_json::json;

fn canon(v: &serde_json::Value) -> String {
    String::from_utf8(to_canonical_json(v, &[]).unwrap()).unwrap()
}

#[test]
fn rfc8785_section_3_2_2_example() {
    let input: serde_json::Value = serde_json::from_str(
        r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],
            "string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
            "literals":[null,true,false]}"#,
    )
    .unwrap();
    assert_eq!(
        canon(&input),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

#[test]
fn rfc8785_sorting_example_orders_by_utf16_code_units() {
    let input: serde_json::Value = serde_json::from_str(
        r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh",
            "1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#,
    )
    .unwrap();
    let out = canon(&input);
    let order: Vec<&str> = ["\\r", "1", "\u{80}", "ö", "€", "😀", "\u{fb33}"].to_vec();
    let mut last = 0;
    for name in order {
        let at = out.find(&format!("\"{name}\":")).expect(name);
        assert!(at >= last, "{name} out of order in {out}");
        last = at;
    }
}

proptest::proptest! {
    /// The byte shortcut orders names exactly as their UTF-16 code units do, over names
    /// that share prefixes and mix ASCII, the BMP above the surrogates and astral planes.
    #[test]
    fn names_compare_as_their_utf16_code_units(
        a in "[a\u{7f}\u{80}\u{7ff}\u{800}\u{e000}\u{ffff}\u{10000}\u{10ffff}]{0,4}",
        b in "[a\u{7f}\u{80}\u{7ff}\u{800}\u{e000}\u{ffff}\u{10000}\u{10ffff}]{0,4}",
    ) {
        proptest::prop_assert_eq!(compare_utf16(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
    }
}

#[test]
fn integers_are_exact_beyond_two_to_the_53() {
    let a = to_canonical_json(&9_007_199_254_740_993_u64, &[]).unwrap();
    let b = to_canonical_json(&9_007_199_254_740_992_u64, &[]).unwrap();
    assert_eq!(a, b"9007199254740993");
    assert_ne!(a, b);
}

#[test]
fn float_forms_match_integers_as_jcs_defines() {
    assert_eq!(to_canonical_json(&1.0_f64, &[]).unwrap(), b"1");
    assert_eq!(to_canonical_json(&1_u8, &[]).unwrap(), b"1");
    assert_eq!(to_canonical_json(&-0.0_f64, &[]).unwrap(), b"0");
    assert_eq!(to_canonical_json(&0.1_f32, &[]).unwrap(), b"0.1");
}

#[test]
fn non_finite_floats_are_errors() {
    assert_eq!(
        to_canonical_json(&f64::NAN, &[]),
        Err(CanonicalError::NonFiniteNumber)
    );
    assert_eq!(
        to_canonical_json(&vec![f32::INFINITY], &[]),
        Err(CanonicalError::NonFiniteNumber)
    );
}

#[test]
fn map_keys_must_be_strings_or_integers() {
    let mut ints = std::collections::HashMap::new();
    ints.insert(10_u32, "a");
    ints.insert(2_u32, "b");
    assert_eq!(
        to_canonical_json(&ints, &[]).unwrap(),
        br#"{"10":"a","2":"b"}"#
    );
    let mut tuples = std::collections::BTreeMap::new();
    tuples.insert((1, 2), "a");
    assert_eq!(
        to_canonical_json(&tuples, &[]),
        Err(CanonicalError::NonStringKey)
    );
}

#[test]
fn skip_paths_leave_out_nested_members_only_where_named() {
    let v = json!({"req": {"trace_id": "t", "amount": 5}, "trace_id": "kept"});
    let out = to_canonical_json(&v, &[&["req", "trace_id"]]).unwrap();
    assert_eq!(out, br#"{"req":{"amount":5},"trace_id":"kept"}"#);
    let out = to_canonical_json(&v, &[&["trace_id"], &["nothing", "here"]]).unwrap();
    assert_eq!(out, br#"{"req":{"amount":5,"trace_id":"t"}}"#);
}

#[test]
fn enums_use_the_external_tagging_of_serde_json() {
    #[derive(serde::Serialize)]
    enum E {
        Unit,
        New(u8),
        Tuple(u8, u8),
        Struct { b: u8, a: u8 },
    }
    let all = vec![E::Unit, E::New(1), E::Tuple(1, 2), E::Struct { b: 2, a: 1 }];
    assert_eq!(
        to_canonical_json(&all, &[]).unwrap(),
        br#"["Unit",{"New":1},{"Tuple":[1,2]},{"Struct":{"a":1,"b":2}}]"#
    );
}

#[test]
fn duplicate_members_are_errors() {
    #[derive(serde::Serialize)]
    struct Inner {
        a: u8,
    }
    #[derive(serde::Serialize)]
    struct Outer {
        a: u8,
        #[serde(flatten)]
        inner: Inner,
    }
    assert!(matches!(
        to_canonical_json(&Outer { a: 1, inner: Inner { a: 2 } }, &[]),
        Err(CanonicalError::DuplicateMember(name)) if name == "a"
    ));
}

#[test]
fn output_parses_back_to_the_same_document() {
    let v = json!({"b": [1, 2.5, "x\u{1}y"], "a": {"z": null, "y": true}, "c": "é\"\\"});
    let out = to_canonical_json(&v, &[]).unwrap();
    let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(back, v);
    assert_eq!(to_canonical_json(&back, &[]).unwrap(), out);
}

fn text(value: &impl serde::Serialize) -> String {
    String::from_utf8(to_canonical_json(value, &[]).unwrap()).unwrap()
}

/// The same JSON text gives the same canonical form whether or not some crate enabled
/// `serde_json/arbitrary_precision` (CI runs these tests both ways): numbers are read back
/// from their text as `serde_json` reads them without the feature.
#[test]
fn numbers_parsed_from_text_are_canonical_with_or_without_arbitrary_precision() {
    let parsed: serde_json::Value = serde_json::from_str(
        r#"[4.50, 1E30, 2e-3, 1.0, 100, 1e2, -0, -7, 18446744073709551615,
            18446744073709551616, -9223372036854775808, 123456789012345678901234567890,
            0.1, 5e-324]"#,
    )
    .unwrap();
    assert_eq!(
        text(&parsed),
        "[4.5,1e+30,0.002,1,100,100,0,-7,18446744073709551615,18446744073709552000,\
         -9223372036854775808,1.2345678901234568e+29,0.1,5e-324]"
    );
    assert_eq!(text(&json!({"n": 1.5, "m": 3})), r#"{"m":3,"n":1.5}"#);
}

/// A raw value is parsed and written canonical: its whitespace and member order, which a
/// client library may change between retries, do not count.
#[test]
fn raw_values_are_canonicalized_not_hashed_as_text() {
    let a: Box<serde_json::value::RawValue> =
        serde_json::from_str(r#"{ "b" : [1.0, 2], "a": "x" }"#).unwrap();
    let b: Box<serde_json::value::RawValue> =
        serde_json::from_str(r#"{"a":"x","b":[1,2]}"#).unwrap();
    assert_eq!(text(&a), r#"{"a":"x","b":[1,2]}"#);
    assert_eq!(text(&a), text(&b));
    #[derive(serde::Serialize)]
    struct Call<'a> {
        id: u8,
        payload: &'a serde_json::value::RawValue,
    }
    assert_eq!(
        text(&Call { id: 1, payload: &a }),
        r#"{"id":1,"payload":{"a":"x","b":[1,2]}}"#
    );
}

/// Every corner of serde's data model has one pinned answer: canonical, or an error.
#[test]
fn serde_corners_are_pinned() {
    use std::collections::BTreeMap;
    // 128-bit integers, exact.
    assert_eq!(text(&u128::MAX), "340282366920938463463374607431768211455");
    assert_eq!(text(&i128::MIN), "-170141183460469231731687303715884105728");
    // Non-finite floats have no JSON form.
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(
            to_canonical_json(&v, &[]),
            Err(CanonicalError::NonFiniteNumber)
        );
    }
    assert_eq!(
        to_canonical_json(&f32::NAN, &[]),
        Err(CanonicalError::NonFiniteNumber)
    );
    // Maps: integer and char keys as text (sorted as text), other keys refused.
    let ints: BTreeMap<i64, &str> = [(10, "b"), (-1, "a"), (9, "c")].into();
    assert_eq!(text(&ints), r#"{"-1":"a","10":"b","9":"c"}"#);
    let chars: BTreeMap<char, u8> = [('z', 1), ('a', 2)].into();
    assert_eq!(text(&chars), r#"{"a":2,"z":1}"#);
    let bools: BTreeMap<bool, u8> = [(true, 1)].into();
    assert_eq!(
        to_canonical_json(&bools, &[]),
        Err(CanonicalError::NonStringKey)
    );
    let tuples: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    assert_eq!(
        to_canonical_json(&tuples, &[]),
        Err(CanonicalError::NonStringKey)
    );
    // Bytes: an array of numbers, as serde_json writes them.
    struct Bytes<'a>(&'a [u8]);
    impl serde::Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }
    assert_eq!(text(&Bytes(&[0, 7, 255])), "[0,7,255]");
    assert_eq!(
        text(&Bytes(&[0, 7, 255])),
        serde_json::to_string(&Bytes(&[0, 7, 255])).unwrap()
    );
    // Newtypes: a struct is its content; a variant is tagged.
    #[derive(serde::Serialize)]
    struct Cents(u64);
    #[derive(serde::Serialize)]
    enum Amount {
        Cents(u64),
    }
    assert_eq!(text(&Cents(500)), "500");
    assert_eq!(text(&Amount::Cents(500)), r#"{"Cents":500}"#);
    // Untagged and internally tagged enums: what serde writes, sorted.
    #[derive(serde::Serialize)]
    #[serde(untagged)]
    enum Id {
        Number(u64),
        Named { name: String, zone: u8 },
    }
    assert_eq!(text(&Id::Number(7)), "7");
    assert_eq!(
        text(&Id::Named {
            zone: 2,
            name: "n".into()
        }),
        r#"{"name":"n","zone":2}"#
    );
    #[derive(serde::Serialize)]
    #[serde(tag = "kind")]
    enum Event {
        Charge { amount: u64 },
    }
    assert_eq!(
        text(&Event::Charge { amount: 5 }),
        r#"{"amount":5,"kind":"Charge"}"#
    );
    // Flatten: the members join the enclosing object, in canonical order.
    #[derive(serde::Serialize)]
    struct Meta {
        trace: u8,
    }
    #[derive(serde::Serialize)]
    struct Req {
        z: u8,
        #[serde(flatten)]
        meta: Meta,
    }
    assert_eq!(
        text(&Req {
            z: 1,
            meta: Meta { trace: 2 }
        }),
        r#"{"trace":2,"z":1}"#
    );
    // Unit, unit struct, none: null.
    #[derive(serde::Serialize)]
    struct Nothing;
    assert_eq!(text(&()), "null");
    assert_eq!(text(&Nothing), "null");
    assert_eq!(text(&None::<u8>), "null");
}
