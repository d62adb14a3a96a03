// check_page.js: what a reader of a docs page would see wrong.
// check_site.sh appends this script to a copy of each page; once MathJax has
// typeset the page, it writes one line per problem into a pre element with id
// flashstep-check (which --dump-dom then shows), ending with "checked".
//   markup:   text outside scripts, code and typeset formulas that still holds
//             Doxygen or TeX source: \f$ \f[ \( \[ \tilde, or markdown that did not
//             render: **bold, a stray backtick
//   heading:  a heading (or its table-of-contents entry) with unrendered math:
//             a backslash or a dollar sign left in its text
//   contrast: text in the page body whose colour on its background is below
//             WCAG AA's 4.5:1 (dark links on dark table headers)
(function () {
  'use strict';
  // Where text is code, formula source or MathJax output, not prose.
  var MACHINERY = 'script, style, [class^="MathJax"], [class*=" MathJax"], ' +
                  '.MJX_Assistive_MathML, #flashstep-check';
  var NOT_PROSE = MACHINERY + ', pre, code, .fragment, .line';
  var MARKUP = [
    [/\\f[$[\]{}]/, 'raw Doxygen formula delimiter'],
    [/\\[()[\]]/, 'unrendered MathJax delimiter'],
    [/\\[A-Za-z]+/, 'raw TeX or Doxygen command'],
    [/\*\*\S|\S\*\*/, 'literal ** (markdown bold not rendered)'],
    [/`/, 'literal backtick (markdown code not rendered)']
  ];
  var HEADINGS = 'h1, h2, h3, h4, h5, h6, div.title, div.toc li a';
  var MIN_CONTRAST = 4.5;

  // The non-blank text nodes under root that are not inside `outside`.
  function textNodes(root, outside) {
    var out = [];
    var walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (var n = walker.nextNode(); n; n = walker.nextNode()) {
      if (n.nodeValue.trim() && !n.parentElement.closest(outside)) out.push(n);
    }
    return out;
  }

  function excerpt(s) {
    s = s.replace(/\s+/g, ' ').trim();
    return s.length > 90 ? s.slice(0, 87) + '...' : s;
  }

  // sRGB colour "rgb(a, b, c)" or "rgba(a, b, c, alpha)" as [r, g, b, alpha].
  function rgba(css) {
    var v = (css.match(/[\d.]+/g) || []).map(Number);
    return [v[0] || 0, v[1] || 0, v[2] || 0, v.length > 3 ? v[3] : 1];
  }

  function luminance(c) {
    var lin = c.slice(0, 3).map(function (x) {
      x /= 255;
      return x <= 0.03928 ? x / 12.92 : Math.pow((x + 0.055) / 1.055, 2.4);
    });
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  }

  // The colour behind el: the nearest ancestor's opaque background, else white.
  function background(el) {
    for (var e = el; e; e = e.parentElement) {
      var c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0.5) return c;
    }
    return [255, 255, 255, 1];
  }

  function contrast(el) {
    var fg = luminance(rgba(getComputedStyle(el).color));
    var bg = luminance(background(el));
    return (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  }

  function check() {
    var problems = [];
    textNodes(document.body, NOT_PROSE).forEach(function (n) {
      var m = MARKUP.find(function (rule) { return rule[0].test(n.nodeValue); });
      if (m) problems.push('markup: ' + m[1] + ': "' + excerpt(n.nodeValue) + '"');
    });
    document.querySelectorAll(HEADINGS).forEach(function (h) {
      var text = textNodes(h, NOT_PROSE).map(function (n) { return n.nodeValue; }).join('');
      if (/[\\$]/.test(text)) problems.push('heading: unrendered math: "' + excerpt(text) + '"');
    });
    // Code and links count here: every glyph a reader must make out.
    var seen = new Set();
    textNodes(document.querySelector('div.contents') || document.body, MACHINERY).forEach(function (n) {
      var el = n.parentElement;
      if (seen.has(el) || !el.getClientRects().length) return;
      seen.add(el);
      var ratio = contrast(el);
      if (ratio < MIN_CONTRAST) {
        problems.push('contrast: ' + ratio.toFixed(2) + ':1 for <' + el.tagName.toLowerCase() +
                      '> "' + excerpt(el.textContent) + '" (' + getComputedStyle(el).color +
                      ' on rgb(' + background(el).slice(0, 3).join(', ') + '))');
      }
    });
    var pre = document.createElement('pre');
    pre.id = 'flashstep-check';
    pre.textContent = problems.concat(['checked']).join('\n');
    document.body.appendChild(pre);
  }

  // MathJax's 'End' startup hook follows the first typesetting of the page.
  window.addEventListener('load', function () {
    if (window.MathJax && window.MathJax.Hub) {
      window.MathJax.Hub.Register.StartupHook('End', function () { window.MathJax.Hub.Queue(check); });
    } else {
      check();
    }
  });
})();
