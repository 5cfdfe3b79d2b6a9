//! Orders: validation, and the one transaction that places an order.
//!
//! Placing an order is all-or-nothing: the order row and its stock decrement commit
//! together, written by one statement (`PLACE_ORDER`). The decrement is conditional
//! (`available >= quantity`), so stock can never go negative however many requests race
//! for it. The order row goes in *first*, with `ON CONFLICT (idempotency_key) DO
//! NOTHING`: a second request with the same key waits on the unique index until the
//! first commits or aborts, then finds the first order instead of writing a second one.
//! Ten identical retries at once give one order.

use chrono::{DateTime, Utc};
use deadline_propagation::Problem;
use deadline_propagation::db::{Check, End};
use serde::{Deserialize, Serialize};
use sqlx::FromRow;
use utoipa::ToSchema;

use crate::budget::Budget;
use crate::store::Store;
use service_kit::answers::Answers as _;

/// The largest quantity one order may ask for.
pub const MAX_QUANTITY: i64 = 1000;

/// The longest accepted `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 255;

/// The body of `POST /api/orders`, before validation. Fields are optional here so a
/// missing one gets a message naming it instead of a generic parse error; the OpenAPI
/// document says what [`validate`](Self::validate) accepts.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"sku": "SKU-00042", "quantity": 1}))]
pub struct NewOrderRequest {
    /// A catalog SKU: 1 to 32 letters, digits, `-` or `_`.
    #[schema(required, value_type = String, pattern = "^[A-Za-z0-9_-]{1,32}$", example = "SKU-00042")]
    sku: Option<String>,
    /// How many, a whole number.
    #[schema(required, value_type = i64, minimum = 1, maximum = 1000)]
    quantity: Option<serde_json::Number>,
}

/// A validated order request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    /// A URL-safe SKU (letters, digits, `-`, `_`), at most 32 characters.
    pub sku: String,
    /// 1 to [`MAX_QUANTITY`].
    pub quantity: i32,
}

impl NewOrderRequest {
    /// Checks every field; the problem (422) names the field that is wrong.
    pub fn validate(self) -> Result<NewOrder, Problem> {
        let sku = self
            .sku
            .ok_or_else(|| Problem::unprocessable("sku is required"))?;
        let sku_ok = !sku.is_empty()
            && sku.len() <= 32
            && sku
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !sku_ok {
            return Err(Problem::unprocessable(
                "sku must be 1 to 32 letters, digits, '-' or '_', like SKU-00001",
            ));
        }
        let quantity = self
            .quantity
            .ok_or_else(|| Problem::unprocessable("quantity is required"))?;
        // JSON has one number type: `2.0` and `1e1` are whole numbers too (JSON Schema's
        // `integer`, which the OpenAPI document promises, accepts them).
        let whole = quantity.as_i64().or_else(|| {
            quantity
                .as_f64()
                .filter(|q| q.fract() == 0.0 && q.abs() <= MAX_QUANTITY as f64)
                .map(|q| q as i64)
        });
        let quantity = whole
            .filter(|q| (1..=MAX_QUANTITY).contains(q))
            .and_then(|q| i32::try_from(q).ok())
            .ok_or_else(|| {
                Problem::unprocessable(format!(
                    "quantity must be a whole number from 1 to {MAX_QUANTITY}, got {quantity}"
                ))
            })?;
        Ok(NewOrder { sku, quantity })
    }
}

/// Checks that `sku` is safe to put into a URL path: 1 to 32 letters, digits, `-`, `_`.
pub fn validate_sku(sku: &str) -> Result<(), Problem> {
    let ok = !sku.is_empty()
        && sku.len() <= 32
        && sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Problem::unprocessable(
            "sku must be 1 to 32 letters, digits, '-' or '_', like SKU-00001",
        ))
    }
}

/// Checks an `Idempotency-Key`: 1 to 255 visible ASCII characters.
pub fn validate_key(key: &[u8]) -> Result<String, Problem> {
    let ok =
        !key.is_empty() && key.len() <= MAX_KEY_LEN && key.iter().all(|b| b.is_ascii_graphic());
    match std::str::from_utf8(key) {
        Ok(key) if ok => Ok(key.to_owned()),
        _ => Err(Problem::invalid_header(
            "Idempotency-Key",
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )),
    }
}

/// A placed order, as stored and as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, FromRow, ToSchema)]
pub struct Order {
    /// Order number.
    pub id: i64,
    /// What was ordered.
    pub sku: String,
    /// How many.
    pub quantity: i32,
    /// Catalog price at the time of the order.
    pub unit_price_cents: i32,
    /// `quantity * unit_price_cents`.
    pub total_cents: i64,
    /// When it was committed.
    #[schema(value_type = String, format = DateTime)]
    pub created_at: DateTime<Utc>,
}

/// The outcome of [`place_order`].
#[derive(Debug)]
pub enum Placed {
    /// A new order was committed.
    Created(Order),
    /// The key was used before for the same request: the first order.
    Replayed(Order),
}

const ORDER_COLUMNS: &str = "id, sku, quantity, unit_price_cents, total_cents, created_at";

/// Inserts the order and takes its stock in one statement, so the whole write is one
/// round trip under the transaction's server-side limit. The order row goes first, with
/// `ON CONFLICT (idempotency_key) DO NOTHING`: a retry waits on the unique index until
/// the first attempt commits or aborts. The stock is taken only if the row went in, and
/// only if enough is left; `stock_taken` tells the two apart, and the caller rolls back
/// when it is false. No row at all means the key is taken. Public so that `cargo xtask
/// cost` measures this very statement.
pub const PLACE_ORDER: &str = "\
    WITH placed AS ( \
        INSERT INTO orders (sku, quantity, unit_price_cents, total_cents, idempotency_key) \
        VALUES ($1, $2, $3, $4, $5) \
        ON CONFLICT (idempotency_key) DO NOTHING \
        RETURNING id, sku, quantity, unit_price_cents, total_cents, created_at \
    ), taken AS ( \
        UPDATE inventory SET available = available - $2 \
        WHERE sku = $1 AND available >= $2 AND EXISTS (SELECT 1 FROM placed) \
        RETURNING 1 \
    ) \
    SELECT placed.*, EXISTS (SELECT 1 FROM taken) AS stock_taken FROM placed";

/// One row of [`PLACE_ORDER`].
#[derive(FromRow)]
struct PlacedRow {
    #[sqlx(flatten)]
    order: Order,
    stock_taken: bool,
}

/// What the order transaction found, before it is turned into an answer.
enum Attempt {
    Created(Order),
    OutOfStock,
    /// The key belongs to a committed order (read in the same transaction).
    KeyTaken(Option<Order>),
}

/// Places `order` at `unit_price_cents` in one transaction, under `budget`.
///
/// The answer tells the truth about the table (docs/design.md §5): `Created` only once the
/// COMMIT is known to have succeeded; every error from here means nothing was written
/// (or, for a COMMIT whose outcome could not be learned, a 500 that says so).
pub async fn place_order(
    store: Store<'_>,
    budget: &Budget,
    order: &NewOrder,
    unit_price_cents: u32,
    key: Option<&str>,
) -> Result<Placed, Problem> {
    let unit_price = i32::try_from(unit_price_cents).map_err(Problem::internal)?;
    let total = i64::from(unit_price) * i64::from(order.quantity);
    let (sku, quantity, key_owned) = (order.sku.clone(), order.quantity, key.map(str::to_owned));
    let attempt = store
        .transaction(budget, move |conn| {
            Box::pin(async move {
                let row: Option<PlacedRow> = sqlx::query_as(PLACE_ORDER)
                    .bind(&sku)
                    .bind(quantity)
                    .bind(unit_price)
                    .bind(total)
                    .bind(&key_owned)
                    .fetch_optional(&mut *conn)
                    .await?;
                Ok(match row {
                    Some(row) if row.stock_taken => {
                        let written = order_exists(row.order.id);
                        End::CommitVerified(Attempt::Created(row.order), written)
                    }
                    Some(_) => End::Rollback(Attempt::OutOfStock),
                    None => {
                        // The key is taken by a committed order; a new statement sees it.
                        let existing = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT {ORDER_COLUMNS} FROM orders WHERE idempotency_key = $1"
                        )))
                        .bind(&key_owned)
                        .fetch_optional(&mut *conn)
                        .await?;
                        End::Rollback(Attempt::KeyTaken(existing))
                    }
                })
            })
        })
        .await?;
    match attempt {
        Attempt::Created(order) => Ok(Placed::Created(order)),
        Attempt::OutOfStock => Err(Problem::conflict(format!(
            "not enough stock of {} for {} item(s)",
            order.sku, order.quantity
        ))),
        Attempt::KeyTaken(Some(existing)) => replay(existing, order).map(Placed::Replayed),
        Attempt::KeyTaken(None) => Err(Problem::internal(
            "an Idempotency-Key conflicted, but its order could not be read",
        )),
    }
}

/// Whether order `id` is in the table: how a COMMIT whose connection was lost learns
/// its outcome (the id is the one the INSERT returned, so the row exists only if that
/// transaction committed).
fn order_exists(id: i64) -> Check {
    Check::new(move |conn| {
        Box::pin(
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1)")
                .bind(id)
                .fetch_one(conn),
        )
    })
}

/// What an `Idempotency-Key` already stands for: a replay of the same order is answered
/// with the stored one, before any downstream call (the downstreams may be slow or down
/// now, and a replay must not be refused with "nothing written" about an order that
/// exists); the same key for a different order is the client's mistake.
pub async fn find_replay(
    store: Store<'_>,
    budget: &Budget,
    order: &NewOrder,
    key: &str,
) -> Result<Option<Order>, Problem> {
    let key = key.to_owned();
    let existing: Option<Order> = store
        .read(budget, move |conn| {
            Box::pin(
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT {ORDER_COLUMNS} FROM orders WHERE idempotency_key = $1"
                )))
                .bind(key)
                .fetch_optional(conn),
            )
        })
        .await?;
    existing.map(|existing| replay(existing, order)).transpose()
}

/// The order stored under a key, as the answer to `order` sent again with that key: the
/// same order is a replay; the key used for a different one is the client's mistake.
fn replay(existing: Order, order: &NewOrder) -> Result<Order, Problem> {
    if existing.sku == order.sku && existing.quantity == order.quantity {
        Ok(existing)
    } else {
        Err(Problem::unprocessable(
            "this Idempotency-Key was already used for a different order",
        ))
    }
}

/// The order with `id`, if any.
pub async fn find_order(
    store: Store<'_>,
    budget: &Budget,
    id: i64,
) -> Result<Option<Order>, Problem> {
    store
        .read(budget, move |conn| {
            Box::pin(
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT {ORDER_COLUMNS} FROM orders WHERE id = $1"
                )))
                .bind(id)
                .fetch_optional(conn),
            )
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request(json: &str) -> Result<NewOrder, String> {
        let parsed: NewOrderRequest = serde_json::from_str(json).unwrap();
        parsed.validate().map_err(|p| p.detail().to_owned())
    }

    #[test]
    fn a_valid_request_passes() {
        assert_eq!(
            request(r#"{"sku":"SKU-00001","quantity":3}"#),
            Ok(NewOrder {
                sku: "SKU-00001".into(),
                quantity: 3
            })
        );
    }

    #[test]
    fn each_invalid_field_is_named() {
        for (json, field) in [
            (r#"{"quantity":1}"#, "sku"),
            (r#"{"sku":"SKU-00001"}"#, "quantity"),
            (r#"{"sku":"SKU-00001","quantity":0}"#, "quantity"),
            (r#"{"sku":"SKU-00001","quantity":-1}"#, "quantity"),
            (r#"{"sku":"SKU-00001","quantity":1001}"#, "quantity"),
            (r#"{"sku":"SKU-00001","quantity":1.5}"#, "quantity"),
            (r#"{"sku":"SKU-00001","quantity":1e30}"#, "quantity"),
            (r#"{"sku":"../admin","quantity":1}"#, "sku"),
            (r#"{"sku":"","quantity":1}"#, "sku"),
        ] {
            let err = request(json).expect_err(json);
            assert!(err.starts_with(field), "{json}: {err}");
        }
    }

    #[test]
    fn idempotency_keys_are_checked() {
        assert!(validate_key(b"abc-123").is_ok());
        assert!(validate_key(b"").is_err());
        assert!(validate_key(b"has space").is_err());
        assert!(validate_key(&[b'a'; 256]).is_err());
    }

    proptest! {
        #[test]
        fn a_validated_order_is_always_within_the_rules(
            sku in "\\PC{0,40}",
            quantity in any::<i64>(),
        ) {
            let request: NewOrderRequest =
                serde_json::from_value(serde_json::json!({"sku": sku, "quantity": quantity})).unwrap();
            match request.validate() {
                Ok(order) => {
                    prop_assert!((1..=MAX_QUANTITY).contains(&i64::from(order.quantity)));
                    prop_assert!(validate_sku(&order.sku).is_ok());
                    prop_assert!(!order.sku.contains('/') && !order.sku.contains('%'));
                }
                Err(problem) => prop_assert_eq!(problem.status().as_u16(), 422),
            }
        }

        #[test]
        fn arbitrary_bodies_and_keys_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(request) = serde_json::from_slice::<NewOrderRequest>(&bytes) {
                let _ = request.validate();
            }
            let _ = validate_key(&bytes);
        }
    }
}
