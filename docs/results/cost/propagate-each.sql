\set sku random(1, 1000)
BEGIN \; SET statement_timeout = 690;
WITH placed AS ( INSERT INTO orders (sku, quantity, unit_price_cents, total_cents, idempotency_key) VALUES (('SKU-' || lpad(CAST(:sku AS text), 5, '0')), 1, 100, 100, NULL) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id, sku, quantity, unit_price_cents, total_cents, created_at ), taken AS ( UPDATE inventory SET available = available - 1 WHERE sku = ('SKU-' || lpad(CAST(:sku AS text), 5, '0')) AND available >= 1 AND EXISTS (SELECT 1 FROM placed) RETURNING 1 ) SELECT placed.*, EXISTS (SELECT 1 FROM taken) AS stock_taken FROM placed;
COMMIT;
