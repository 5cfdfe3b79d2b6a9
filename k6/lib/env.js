// Settings from environment variables (`k6 run -e NAME=value` or the shell), shared by
// the scripts in k6/. A bad value fails at start-up with the variable's name, instead
// of producing a silently wrong run.

export function envString(name, fallback) {
  const value = __ENV[name];
  return value === undefined || value === '' ? fallback : value;
}

export function envInt(name, fallback) {
  const raw = envString(name, String(fallback));
  if (!/^\d+$/.test(raw.trim())) {
    throw new Error(`${name} must be a non-negative integer, got "${raw}"`);
  }
  return parseInt(raw.trim(), 10);
}

export function envChoice(name, fallback, allowed) {
  const value = envString(name, fallback);
  if (!allowed.includes(value)) {
    throw new Error(`${name} must be one of ${allowed.join(', ')}, got "${value}"`);
  }
  return value;
}
