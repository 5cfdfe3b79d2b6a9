-- Stock per SKU. The CHECK is the last line of defence: the decrement itself is
-- conditional, so it never goes negative under concurrency.
CREATE TABLE inventory (
    sku       text    PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);

-- SKU-00001 ... SKU-01000, as in the catalog, with stock for long load runs.
INSERT INTO inventory (sku, available)
SELECT 'SKU-' || lpad(n::text, 5, '0'), 100000000
FROM generate_series(1, 1000) AS n;

CREATE TABLE orders (
    id               bigserial   PRIMARY KEY,
    sku              text        NOT NULL REFERENCES inventory (sku),
    quantity         integer     NOT NULL CHECK (quantity BETWEEN 1 AND 1000),
    unit_price_cents integer     NOT NULL CHECK (unit_price_cents >= 0),
    total_cents      bigint      NOT NULL,
    -- A retried POST with the same key returns the first order instead of a second.
    idempotency_key  text        UNIQUE,
    created_at       timestamptz NOT NULL DEFAULT now()
);
