#!/bin/sh
# check_site.sh HTML_DIR [PAGE...]
# Checks the generated docs site (docs/CMakeLists.txt, test docs.browser):
#  1. every relative href/src in HTML_DIR/*.html points at an existing file
#     (absolute file paths, such as Debian's MathJax, must exist too);
#  2. headless Chromium opens index.html and each PAGE (default: stage03.html),
#     MathJax typesets the formulas (MathJax output in the DOM, no raw \f$ or
#     \f[, no "Math Processing Error"), and a screenshot is saved beside
#     HTML_DIR in screenshots/.
# Exit 0 pass, 1 fail, 77 skipped (no chromium).
set -u
html=${1:?usage: check_site.sh HTML_DIR [PAGE...]}
shift
pages=${*:-stage03.html}
skip=77
chromium=${CHROMIUM:-}
if [ -z "$chromium" ]; then
  for c in chromium chromium-browser google-chrome; do
    if command -v "$c" >/dev/null 2>&1; then chromium=$c; break; fi
  done
fi
if [ -z "$chromium" ] || ! command -v "$chromium" >/dev/null 2>&1; then
  echo "chromium not installed: skipped"; exit $skip
fi
[ -f "$html/index.html" ] || { echo "FAIL: no $html/index.html (build the docs target first)"; exit 1; }
html=$(cd "$html" && pwd)
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Internal links.
links=0; broken=0
grep -oHE '(href|src)="[^"]*"' "$html"/*.html | sed -E 's/:(href|src)="/\t/; s/"$//' > "$tmp/links"
while IFS='	' read -r file link; do
  case $link in
    ''|'#'*|http:*|https:*|mailto:*|javascript:*|data:*|ftp:*) continue ;;
  esac
  target=${link%%#*}; target=${target%%\?*}
  [ -n "$target" ] || continue
  case $target in
    file://*) target=${target#file://} ;;
  esac
  case $target in
    /*) path=$target ;;
    *) path=$(dirname "$file")/$target ;;
  esac
  links=$((links + 1))
  if [ ! -e "$path" ]; then
    echo "FAIL: broken link in $(basename "$file"): $link"
    broken=$((broken + 1))
  fi
done < "$tmp/links"
echo "links: $links checked, $broken broken"
[ $broken -eq 0 ] || fail=1

# 2. Headless Chromium: formulas typeset, screenshot.
shots=$(dirname "$html")/screenshots
mkdir -p "$shots"
run_chromium() {
  HOME=$tmp "$chromium" --headless --disable-gpu --no-sandbox --no-first-run \
    --user-data-dir="$tmp/profile" --allow-file-access-from-files \
    --virtual-time-budget=10000 --window-size=1280,1600 "$@" 2>>"$tmp/chromium.log"
}
for page in index.html $pages; do
  [ -f "$html/$page" ] || { echo "FAIL: no page $page"; fail=1; continue; }
  url="file://$html/$page"
  run_chromium --dump-dom "$url" > "$tmp/dom.html"
  if [ ! -s "$tmp/dom.html" ]; then
    echo "FAIL: $page: chromium dumped no DOM"; tail -5 "$tmp/chromium.log"; fail=1; continue
  fi
  raw_tex=$(grep -c '\(\\f\$\|\\f\[\)' "$tmp/dom.html")
  typeset=$(grep -oE 'class="MathJax_SVG|class="MathJax_CHTML|<mjx-container|class="MathJax[ "]' "$tmp/dom.html" | wc -l)
  errors=$(grep -c 'Math Processing Error' "$tmp/dom.html")
  scripts=$(grep -c 'type="math/tex' "$tmp/dom.html")
  echo "$page: $typeset MathJax elements, $scripts TeX sources, $raw_tex lines with raw TeX delimiters, $errors MathJax errors"
  if [ "$typeset" -eq 0 ]; then echo "FAIL: $page: MathJax did not typeset any formula"; fail=1; fi
  if [ "$raw_tex" -ne 0 ]; then echo "FAIL: $page: raw \\f\$ or \\f[ left in the page"; fail=1; fi
  if [ "$errors" -ne 0 ]; then echo "FAIL: $page: MathJax reported an error"; fail=1; fi
  shot="$shots/${page%.html}.png"
  (cd "$tmp" && run_chromium --screenshot="$shot" "$url" >/dev/null)
  if [ -s "$shot" ]; then echo "screenshot: $shot"; else echo "FAIL: $page: no screenshot"; fail=1; fi
done
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
