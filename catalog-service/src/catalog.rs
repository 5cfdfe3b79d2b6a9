//! The catalog: 1000 items with deterministic names and prices, so tests and load runs
//! know every SKU in advance and the inventory seed of orders-service matches it.

use serde::Serialize;

/// How many SKUs exist: `SKU-00001` ... `SKU-01000`.
pub const SKU_COUNT: u32 = 1000;

/// One catalog item, as served by `GET /catalog/{sku}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Item {
    /// `SKU-00001` ... `SKU-01000`.
    pub sku: String,
    /// A readable, deterministic name.
    pub name: String,
    /// Price in cents, from 199 to 9998.
    pub price_cents: u32,
}

const ADJECTIVES: [&str; 10] = [
    "Sturdy", "Compact", "Quiet", "Bright", "Rugged", "Slim", "Classic", "Swift", "Modular",
    "Vintage",
];
const NOUNS: [&str; 10] = [
    "Lamp", "Kettle", "Backpack", "Notebook", "Headset", "Mug", "Chair", "Clock", "Speaker",
    "Bottle",
];

/// The item for `sku`, or `None` when no such SKU exists.
pub fn lookup(sku: &str) -> Option<Item> {
    let n = sku_number(sku)?;
    let i = usize::try_from(n).ok()?;
    Some(Item {
        sku: sku.to_owned(),
        name: format!("{} {} {n}", ADJECTIVES[i % 10], NOUNS[(i / 10) % 10]),
        price_cents: 199 + (n * 7919) % 9800,
    })
}

/// `SKU-00042` gives 42; anything else, including `SKU-42` and `SKU-01001`, gives `None`.
fn sku_number(sku: &str) -> Option<u32> {
    let digits = sku.strip_prefix("SKU-")?;
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u32 = digits.parse().ok()?;
    (1..=SKU_COUNT).contains(&n).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sku_from_1_to_1000_exists_and_nothing_else() {
        assert!(lookup("SKU-00001").is_some());
        assert!(lookup("SKU-01000").is_some());
        for missing in [
            "SKU-00000",
            "SKU-01001",
            "SKU-1",
            "sku-00001",
            "SKU-0000a",
            "",
        ] {
            assert_eq!(lookup(missing), None, "{missing}");
        }
    }

    #[test]
    fn items_are_deterministic() {
        assert_eq!(lookup("SKU-00042"), lookup("SKU-00042"));
        assert_eq!(lookup("SKU-00042").unwrap().name, "Quiet Headset 42");
    }
}
