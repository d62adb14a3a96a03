#!/bin/sh
# check_site.sh HTML_DIR [PAGE...]
# Checks the generated docs site (docs/CMakeLists.txt, test docs.browser):
#  1. every relative href/src in HTML_DIR/*.html points at an existing file
#     (absolute file paths, such as Debian's MathJax, must exist too);
#  2. no generated page (source listings aside) holds a raw \f$ or \f[ in its
#     HTML: Doxygen left the formula unprocessed;
#  3. headless Chromium opens index.html and each PAGE (default: index.html
#     alone; CTest passes every page of the site): MathJax typesets the formulas
#     (MathJax output in the DOM, no "Math Processing Error"), and
#     check_page.js, run in a copy of the page once MathJax is done, finds
#     nothing a reader would see wrong: markup that did not render (\f$, \(,
#     TeX commands, **bold, stray backticks) in the text outside scripts, code
#     and formulas; unrendered math in a heading; text below WCAG AA contrast
#     on its background. A screenshot of each page is saved beside HTML_DIR in
#     screenshots/.
# Exit 0 pass, 1 fail, 77 skipped (no chromium).
set -u
html=${1:?usage: check_site.sh HTML_DIR [PAGE...]}
shift
pages=${*:-}
checker=$(dirname "$0")/check_page.js
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

# 2. Doxygen formulas it did not process (they reach the HTML as written).
raw_pages=$(grep -l -e '\\f\$' -e '\\f\[' "$html"/*.html | grep -v '_source\.html$')
for f in $raw_pages; do
  printf '%s\n' "FAIL: $(basename "$f"): a raw \\f\$ or \\f[ in the generated HTML:"
  grep -n -e '\\f\$' -e '\\f\[' "$f" | head -3 | sed 's/^/    /'
  fail=1
done

# 3. Headless Chromium: formulas typeset, the page reads as written, screenshot.
# The checker runs in a copy of the site, so the build's pages stay untouched.
shots=$(dirname "$html")/screenshots
mkdir -p "$shots"
cp -R "$html" "$tmp/site"
run_chromium() {
  HOME=$tmp "$chromium" --headless --disable-gpu --no-sandbox --no-first-run \
    --user-data-dir="$tmp/profile" --allow-file-access-from-files \
    --virtual-time-budget=10000 --window-size=1280,1600 "$@" 2>>"$tmp/chromium.log"
}
checked=""
for page in index.html $pages; do
  case " $checked " in *" $page "*) continue ;; esac
  checked="$checked $page"
  [ -f "$html/$page" ] || { echo "FAIL: no page $page"; fail=1; continue; }
  copy="$tmp/site/$page"
  { sed 's#</body>##; s#</html>##' "$html/$page"; echo '<script>'; cat "$checker";
    echo '</script></body></html>'; } > "$copy"
  run_chromium --dump-dom "file://$copy" > "$tmp/dom.html"
  if [ ! -s "$tmp/dom.html" ]; then
    echo "FAIL: $page: chromium dumped no DOM"; tail -5 "$tmp/chromium.log"; fail=1; continue
  fi
  typeset=$(grep -oE 'class="MathJax_SVG|class="MathJax_CHTML|<mjx-container|class="MathJax[ "]' "$tmp/dom.html" | wc -l)
  errors=$(grep -c 'Math Processing Error' "$tmp/dom.html")
  scripts=$(grep -c 'type="math/tex' "$tmp/dom.html")
  # check_page.js's report: one problem a line, then "checked".
  awk '/<pre id="flashstep-check">/ { on = 1; sub(/.*<pre id="flashstep-check">/, "") }
       on { if (sub(/<\/pre>.*/, "")) { print; exit } print }' "$tmp/dom.html" |
    sed 's/&lt;/</g; s/&gt;/>/g; s/&quot;/"/g; s/&amp;/\&/g' > "$tmp/report"
  problems=$(grep -vc '^checked$' "$tmp/report")
  echo "$page: $typeset MathJax elements, $scripts TeX sources, $errors MathJax errors, $problems problems seen"
  if [ "$scripts" -ne 0 ] && [ "$typeset" -eq 0 ]; then
    echo "FAIL: $page: MathJax did not typeset any formula"; fail=1
  fi
  if [ "$errors" -ne 0 ]; then echo "FAIL: $page: MathJax reported an error"; fail=1; fi
  if ! grep -q '^checked$' "$tmp/report"; then
    echo "FAIL: $page: check_page.js did not report (did the page finish loading?)"; fail=1
  elif [ "$problems" -ne 0 ]; then
    grep -v '^checked$' "$tmp/report" | sed "s|^|FAIL: $page: |"
    fail=1
  fi
  shot="$shots/${page%.html}.png"
  (cd "$tmp" && run_chromium --screenshot="$shot" "file://$html/$page" >/dev/null)
  if [ -s "$shot" ]; then echo "screenshot: $shot"; else echo "FAIL: $page: no screenshot"; fail=1; fi
done
[ $fail -eq 0 ] && echo "PASS" || echo "FAILED"
exit $fail
