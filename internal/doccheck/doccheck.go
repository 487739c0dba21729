// Package doccheck checks the repository's Markdown: that every relative
// link reaches a file that exists, that every #anchor names a heading of
// the page it points to (by GitHub's slugs), and it gives the tests the
// fenced code blocks of a page, so that the example requests in the
// documentation can be run through the request decoder.
package doccheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// skipDirs are folders that hold no documentation of the repository's own:
// version control, built binaries, caches of modules and tools, run data.
var skipDirs = map[string]bool{
	".git": true, ".cache": true, "bin": true, "node_modules": true,
	"vendor": true, "data": true, "testdata": true,
}

// Files returns the Markdown files under root, sorted, as paths relative to
// root, skipping the folders of skipDirs and any Go module cache
// (a pkg/mod folder).
func Files(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (skipDirs[d.Name()] || filepath.Base(filepath.Dir(path)) == "pkg" && d.Name() == "mod") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("walk %s: %w", root, err)
	}
	sort.Strings(out)
	return out, nil
}

// Page is one Markdown file, split into what the checks need.
type Page struct {
	// Lines are the lines outside fenced code blocks, with their numbers.
	Lines []Line
	// Slugs are the anchors of the page's headings.
	Slugs map[string]bool
	// Blocks are the fenced code blocks.
	Blocks []Block
}

// Line is one line of text and its number, counting from 1.
type Line struct {
	N    int
	Text string
}

// Block is a fenced code block: the first word of its info string ("json",
// "go", "sh", or "" for none), the rest of it (Attrs, as "file=job.json"),
// its text, and the line of its opening fence.
type Block struct {
	Info  string
	Attrs string
	Text  string
	Line  int
}

var fence = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([^`\\s]*)([^`]*)$")

// Parse reads a Markdown file.
func Parse(path string) (*Page, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	p := &Page{Slugs: map[string]bool{}}
	seen := map[string]int{}
	var open string // the fence of the open block, "" outside blocks
	var block *Block
	var body []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if m := fence.FindStringSubmatch(text); m != nil {
			switch {
			case open == "":
				open, block, body = m[1], &Block{Info: m[2], Attrs: strings.TrimSpace(m[3]), Line: n}, nil
				continue
			case strings.HasPrefix(m[1], open[:1]) && len(m[1]) >= len(open) && m[2] == "" && strings.TrimSpace(m[3]) == "":
				block.Text = strings.Join(body, "\n")
				p.Blocks = append(p.Blocks, *block)
				open, block = "", nil
				continue
			}
		}
		if open != "" {
			body = append(body, text)
			continue
		}
		p.Lines = append(p.Lines, Line{N: n, Text: text})
		if h, ok := heading(text); ok {
			s := Slug(h)
			if k := seen[s]; k > 0 {
				p.Slugs[fmt.Sprintf("%s-%d", s, k)] = true
			} else {
				p.Slugs[s] = true
			}
			seen[s]++
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if open != "" {
		return nil, fmt.Errorf("%s:%d: a code block is never closed", path, block.Line)
	}
	return p, nil
}

var atx = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(\s+#+)?\s*$`)

func heading(line string) (string, bool) {
	m := atx.FindStringSubmatch(line)
	if m == nil {
		return "", false
	}
	return m[1], true
}

var (
	link = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	code = regexp.MustCompile("`+[^`]*`+")
)

// Slug is the anchor GitHub gives a heading: its text as shown (links by
// their text, without code marks or emphasis), lowercased, without
// punctuation but hyphens and underscores, spaces made hyphens.
func Slug(h string) string {
	h = link.ReplaceAllString(h, "$1")
	h = strings.NewReplacer("`", "", "**", "", "__", "").Replace(h)
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Link is one link of a page.
type Link struct {
	Line   int
	Target string
}

// Links returns the links of a page outside code: inline links and images.
func (p *Page) Links() []Link {
	var out []Link
	for _, l := range p.Lines {
		text := code.ReplaceAllString(l.Text, "")
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			out = append(out, Link{Line: l.N, Target: m[2]})
		}
	}
	return out
}

// Check checks every link of every Markdown file under root and returns a
// problem per broken one, as "file:line: what".
func Check(root string) ([]string, error) {
	files, err := Files(root)
	if err != nil {
		return nil, err
	}
	pages := map[string]*Page{}
	page := func(rel string) (*Page, error) {
		if p, ok := pages[rel]; ok {
			return p, nil
		}
		p, err := Parse(filepath.Join(root, rel))
		if err != nil {
			return nil, err
		}
		pages[rel] = p
		return p, nil
	}
	var problems []string
	for _, rel := range files {
		p, err := page(rel)
		if err != nil {
			return nil, err
		}
		for _, l := range p.Links() {
			if why := checkLink(root, rel, l.Target, page); why != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", rel, l.Line, l.Target, why))
			}
		}
	}
	return problems, nil
}

var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// checkLink says what is wrong with one link of the page at rel, or "".
func checkLink(root, rel, target string, page func(string) (*Page, error)) string {
	if target == "" {
		return "an empty link"
	}
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // another site's: not checked here
	}
	path, anchor, _ := strings.Cut(target, "#")
	if p, err := url.PathUnescape(path); err == nil {
		path = p
	}
	if strings.HasPrefix(path, "/") {
		return "an absolute path: GitHub resolves it against the site, not the repository"
	}
	to := rel
	if path != "" {
		to = filepath.Clean(filepath.Join(filepath.Dir(rel), path))
		if to == ".." || strings.HasPrefix(to, ".."+string(filepath.Separator)) {
			return "outside the repository"
		}
		info, err := os.Stat(filepath.Join(root, to))
		if err != nil {
			return "no such file"
		}
		if info.IsDir() {
			if anchor != "" {
				return "an anchor on a folder"
			}
			return ""
		}
	}
	if anchor == "" {
		return ""
	}
	if !strings.HasSuffix(to, ".md") {
		return "an anchor on a file that is not Markdown"
	}
	p, err := page(to)
	if err != nil {
		return err.Error()
	}
	if !p.Slugs[anchor] {
		return fmt.Sprintf("no heading of %s has the anchor #%s", to, anchor)
	}
	return ""
}
