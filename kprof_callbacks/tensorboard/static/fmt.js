// Numbers as the text and HTML reports write them (analysis/fmt.py): the same rules and the same rounding, so a
// duration or a confidence level reads alike in the terminal, the HTML report and the tab.

/** `x` with `digits` decimals: toFixed rounds the float's exact value, a tie away from zero, as fmt.py's `fixed`. */
export function fixed(x, digits) {
  return (x === 0 ? 0 : x).toFixed(digits);
}

/** Microseconds as `812 us`, `12.3 ms` or `1.24 s` (fmt.py's `duration`). */
export function duration(us) {
  const abs = Math.abs(us);
  if (abs >= 1e6) return `${fixed(us / 1e6, 2)} s`;
  if (abs >= 1e3) return abs >= 1e4 ? `${fixed(us / 1e3, 1)} ms` : `${fixed(us / 1e3, 2)} ms`;
  return abs < 100 ? `${fixed(us, 1)} us` : `${fixed(us, 0)} us`;
}

/** A confidence level with the decimals that show its miss rate to two significant digits; never `100%`. */
export function level(confidence) {
  const miss = 100 * (1 - confidence);
  const digits = Math.max(0, 1 - Math.floor(Math.log10(miss)));
  const text = fixed(100 - miss, digits);
  return `${text.includes('.') ? text.replace(/0+$/, '').replace(/\.$/, '') : text}%`;
}
