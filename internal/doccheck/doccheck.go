// Package doccheck finds the names a package's doc.go gives in Go form that
// no declaration carries: a function, type, method, field or constant that
// was renamed or removed while the prose describing it stayed. Its test runs
// it over every doc.go of the module.
//
// # Which words are names
//
// A doc comment is prose about the package, and most of its words are
// English or the names of other systems (Raft, Pebble, Kafka, gRPC). Only
// words written the way Go code writes a name are checked:
//
//   - a doc link: [Wheel.Advance], [raftfsm.FSM];
//   - a dotted X.Y (or X.Y.Z) whose X is declared in the package (a type, or
//     a variable or constant of a known type: Tuning.WheelHorizon,
//     firing.pin) or is the name of a package of the module (raftfsm.FSM,
//     publish.Config.WriteTimeout). X.Y whose X is nothing of the module
//     (e.g., v1.7.3, context.Context, backoff.ExponentialBackOff) is left
//     alone;
//   - a word with an inner capital (horizonLoop, ScheduleBatch,
//     NotPermittedError), a word followed by () (Close()), and a word with
//     an underscore that mixes cases as generated Go names do
//     (RecurringRule_Cron). A capitalised word alone (Tuning, Open) is
//     not checked: it reads as English too often to tell;
//   - a backquoted word of one of the forms above.
//
// Code blocks and URLs are not read, and neither is X.go or another file
// name (config.go, cluster.json). A few words of other systems that look
// like Go names are allowed by name (allowed).
//
// # What resolves
//
// An unexported name written alone resolves when the package declares it
// anywhere: at top level, as a method or a field of one of its types, or as
// a local name of one of its functions (a doc may name a parameter). An
// exported one may also be declared, at top level or as a field or method,
// by any package of the module or by a package this one imports: prose
// often names another package's type, or a field of a library's
// configuration (memberlist's GossipVerifyIncoming), without a qualifier.
//
// A dotted name resolves member by member: X.Y is a field or method of X's
// type, including those promoted from embedded types; where a step leaves
// the types of the module (a field of a map or function type, a type
// embedded from another module), what follows is not checked. A name
// qualified with a package of the module (raftfsm.FSM) resolves in that
// package.
//
// Declarations are read from every .go file of the package directory, tests
// and files of every build tag included; nothing is compiled. The packages
// of other modules are found with go list -find and read from their source.
package doccheck

import (
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// allowed are words of other systems that look like Go names. Keep it
// short: a word belongs here only if it is not, and never was, a name in
// the module.
var allowed = map[string]bool{
	"gRPC":          true, // the RPC system
	"LogAppendTime": true, // Kafka's timestamp type of a record the broker stamps
	// Units of size.
	"KiB": true, "MiB": true, "GiB": true,
}

// fileExts are the last elements of a dotted word that make it a file name
// (config.go, cluster.json), not a member.
var fileExts = map[string]bool{
	"go": true, "mod": true, "sum": true, "md": true, "proto": true, "json": true,
	"yaml": true, "yml": true, "toml": true, "sh": true, "txt": true, "tmp": true,
	"pem": true, "crt": true, "key": true, "svg": true, "html": true, "csv": true,
	"db": true, "zip": true,
}

// A Problem is a name a doc.go gives that does not resolve.
type Problem struct {
	File string // the doc.go, relative to the root given to Check
	Line int    // the first line of File where Name is written
	Name string // as written, without brackets or backquotes
	Why  string
}

func (p Problem) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", p.File, p.Line, p.Name, p.Why)
}

// Check reads the module rooted at root (the directory of its go.mod) and
// returns the problems of every doc.go of its packages. Directories holding
// a go.mod of their own (other modules), testdata and directories whose name
// starts with . or _ are not part of the module.
func Check(root string) ([]Problem, error) {
	m, err := loadModule(root)
	if err != nil {
		return nil, err
	}
	var problems []Problem
	dirs := make([]string, 0, len(m.byDir))
	for dir := range m.byDir {
		dirs = append(dirs, dir)
	}
	sort.Strings(dirs)
	for _, dir := range dirs {
		p := m.byDir[dir]
		if p.doc == nil {
			continue
		}
		problems = append(problems, m.checkDoc(p)...)
	}
	return problems, nil
}

// module is what Check knows of the module: its packages by directory and
// by import path.
type module struct {
	root, path string
	byDir      map[string]*pkg // by directory relative to root, "." for the root
	byPath     map[string]*pkg
	byName     map[string][]*pkg // by package name; packages with non-test files only
	ext        map[string]*pkg   // packages of other modules and the standard library that the module's documented packages import, by import path
}

// pkg indexes the declarations of one package directory.
type pkg struct {
	dir, path, name string
	tests           bool                // only _test.go files: not a package others can import
	doc             *ast.File           // doc.go, nil when there is none
	docFile         string              // its path relative to the module root
	top             map[string]ast.Expr // top-level names; a variable's type when known, else nil
	types           map[string]*typeDecl
	members         map[string]bool   // every field and method name of the package's types
	locals          map[string]bool   // every other name declared in the package
	imports         map[string]string // import name -> import path, over all files
}

// typeDecl is what a type declaration says about the type's members.
type typeDecl struct {
	fields   map[string]ast.Expr // field (or interface method) -> its type
	methods  map[string]bool
	embedded []ast.Expr // embedded fields and interfaces
	of       ast.Expr   // for a defined type `type A B`, B
}

func loadModule(root string) (*module, error) {
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	m := &module{root: root, byDir: map[string]*pkg{}, byPath: map[string]*pkg{}, byName: map[string][]*pkg{}}
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			m.path = strings.Trim(f[1], `"`)
		}
	}
	if m.path == "" {
		return nil, fmt.Errorf("%s: no module line", filepath.Join(root, "go.mod"))
	}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel != "." {
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		pk, err := loadPackage(p, rel, m.path, true)
		if err != nil || pk == nil {
			return err
		}
		m.byDir[pk.dir] = pk
		if !pk.tests {
			m.byPath[pk.path] = pk
			m.byName[pk.name] = append(m.byName[pk.name], pk)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return m, m.loadImports()
}

// loadImports indexes the packages of other modules and of the standard
// library that the module's documented packages import, found where the go
// command finds them (the module cache, GOROOT).
func (m *module) loadImports() error {
	m.ext = map[string]*pkg{}
	var paths []string
	seen := map[string]bool{}
	for _, p := range m.byDir {
		if p.doc == nil {
			continue
		}
		for _, ip := range p.imports {
			if m.byPath[ip] == nil && !seen[ip] && ip != "C" {
				seen[ip] = true
				paths = append(paths, ip)
			}
		}
	}
	if len(paths) == 0 {
		return nil
	}
	sort.Strings(paths)
	// Only doccheck's test runs this, and go test puts the GOROOT/bin of the
	// go command that runs it first on the test's PATH (Go 1.19 and later):
	// "go" is that go command.
	cmd := exec.Command("go", append([]string{"list", "-e", "-find", "-f", "{{.ImportPath}}\t{{.Dir}}"}, paths...)...)
	cmd.Dir = m.root
	// The module alone: a go.work above it (the testdata's) may not list it.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list -find (in %s): %v\n%s", m.root, err, stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		ip, dir, ok := strings.Cut(line, "\t")
		if !ok || dir == "" {
			continue
		}
		q, err := loadPackage(dir, "", ip, false)
		if err != nil {
			return err
		}
		if q != nil {
			m.ext[ip] = q
		}
	}
	return nil
}

// loadPackage parses the .go files of dir, rel to the module root; nil when
// there are none. A package of the module (own) is read whole; of another
// package, only what its non-test files declare at top level and in its
// types is kept.
func loadPackage(dir, rel, modPath string, own bool) (*pkg, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	p := &pkg{
		dir: filepath.ToSlash(rel), path: path.Join(modPath, filepath.ToSlash(rel)),
		top: map[string]ast.Expr{}, types: map[string]*typeDecl{}, members: map[string]bool{},
		locals: map[string]bool{}, imports: map[string]string{},
	}
	fset := token.NewFileSet()
	named := false
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || !own && strings.HasSuffix(name, "_test.go") {
			continue
		}
		mode := parser.SkipObjectResolution
		if own && name == "doc.go" {
			mode |= parser.ParseComments
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, mode)
		if err != nil {
			return nil, err
		}
		// The package's name is its non-test files'; a directory of tests
		// alone takes it from them.
		if !strings.HasSuffix(name, "_test.go") {
			p.name, named = f.Name.Name, true
		} else if !named {
			p.name = strings.TrimSuffix(f.Name.Name, "_test")
		}
		if name == "doc.go" {
			p.doc, p.docFile = f, filepath.ToSlash(filepath.Join(rel, name))
		}
		p.add(f, own)
	}
	if p.name == "" {
		return nil, nil
	}
	p.tests = !named
	return p, nil
}

// add indexes the declarations of f.
func (p *pkg) add(f *ast.File, locals bool) {
	for _, imp := range f.Imports {
		ip, _ := strconv.Unquote(imp.Path.Value)
		name := importName(ip)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if name != "_" && name != "." {
			p.imports[name] = ip
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				p.top[d.Name.Name] = nil
			} else {
				recv := baseTypeName(d.Recv.List[0].Type)
				p.typeDecl(recv).methods[d.Name.Name] = true
				p.members[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					p.top[s.Name.Name] = nil
					p.addType(s)
				case *ast.ValueSpec:
					for i, n := range s.Names {
						typ := s.Type
						if typ == nil && i < len(s.Values) {
							typ = literalType(s.Values[i])
						}
						p.top[n.Name] = typ
					}
				}
			}
		}
	}
	if !locals {
		return
	}
	// Every other name declared in a function: parameters, results,
	// variables, labels. Found syntactically, as the identifiers on the
	// left of := and in declarations.
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.Field:
			for _, id := range n.Names {
				p.locals[id.Name] = true
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				p.locals[id.Name] = true
			}
		case *ast.TypeSpec:
			p.locals[n.Name.Name] = true
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						p.locals[id.Name] = true
					}
				}
			}
		case *ast.RangeStmt:
			for _, e := range []ast.Expr{n.Key, n.Value} {
				if id, ok := e.(*ast.Ident); ok && n.Tok == token.DEFINE {
					p.locals[id.Name] = true
				}
			}
		case *ast.LabeledStmt:
			p.locals[n.Label.Name] = true
		}
		return true
	})
}

func (p *pkg) typeDecl(name string) *typeDecl {
	t := p.types[name]
	if t == nil {
		t = &typeDecl{fields: map[string]ast.Expr{}, methods: map[string]bool{}}
		p.types[name] = t
	}
	return t
}

func (p *pkg) addType(s *ast.TypeSpec) {
	t := p.typeDecl(s.Name.Name)
	switch typ := s.Type.(type) {
	case *ast.StructType:
		for _, f := range typ.Fields.List {
			if len(f.Names) == 0 {
				t.embedded = append(t.embedded, f.Type)
				if n := baseTypeName(f.Type); n != "" {
					t.fields[n] = f.Type
					p.members[n] = true
				}
				continue
			}
			for _, n := range f.Names {
				t.fields[n.Name] = f.Type
				p.members[n.Name] = true
			}
		}
	case *ast.InterfaceType:
		for _, f := range typ.Methods.List {
			if len(f.Names) == 0 {
				t.embedded = append(t.embedded, f.Type)
				continue
			}
			for _, n := range f.Names {
				t.methods[n.Name] = true
				p.members[n.Name] = true
			}
		}
	default:
		t.of = s.Type // type A B, or an alias
	}
}

// literalType returns T for a value T{...}, &T{...} or new(T), else nil.
func literalType(v ast.Expr) ast.Expr {
	switch v := v.(type) {
	case *ast.CompositeLit:
		return v.Type
	case *ast.UnaryExpr:
		if v.Op == token.AND {
			return literalType(v.X)
		}
	case *ast.CallExpr:
		if id, ok := v.Fun.(*ast.Ident); ok && id.Name == "new" && len(v.Args) == 1 {
			return v.Args[0]
		}
	}
	return nil
}

// baseTypeName returns the name of the type an expression such as T, *T,
// T[K] or pkg.T names, "" for any other type.
func baseTypeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return baseTypeName(e.X)
	case *ast.IndexExpr:
		return baseTypeName(e.X)
	case *ast.IndexListExpr:
		return baseTypeName(e.X)
	case *ast.SelectorExpr:
		return e.Sel.Name
	case *ast.ParenExpr:
		return baseTypeName(e.X)
	}
	return ""
}

// importName is the name a package is imported by when the import does not
// name it: the last element of its path, less a major version suffix and a
// go- prefix or .go/-go suffix.
func importName(ip string) string {
	elems := strings.Split(ip, "/")
	name := elems[len(elems)-1]
	if len(elems) > 1 && len(name) > 1 && name[0] == 'v' && strings.Trim(name[1:], "0123456789") == "" {
		name = elems[len(elems)-2]
	}
	name = strings.TrimPrefix(name, "go-")
	name = strings.TrimSuffix(strings.TrimSuffix(name, ".go"), "-go")
	return name
}

// typeRef is a type of the module, or none (nil pkg) when a step leads out
// of what the module declares.
type typeRef struct {
	p    *pkg
	name string
}

// typeOf returns the type of the module an expression found in p names.
func (m *module) typeOf(p *pkg, e ast.Expr) typeRef {
	switch e := e.(type) {
	case *ast.Ident:
		if _, ok := p.types[e.Name]; ok {
			return typeRef{p, e.Name}
		}
	case *ast.StarExpr:
		return m.typeOf(p, e.X)
	case *ast.ParenExpr:
		return m.typeOf(p, e.X)
	case *ast.IndexExpr:
		return m.typeOf(p, e.X)
	case *ast.IndexListExpr:
		return m.typeOf(p, e.X)
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok {
			if q := m.byPath[p.imports[x.Name]]; q != nil {
				if _, ok := q.types[e.Sel.Name]; ok {
					return typeRef{q, e.Sel.Name}
				}
			}
		}
	}
	return typeRef{}
}

// member looks name up among the fields and methods of t, promoted ones
// included. found is false with unsure true when t embeds a type the module
// does not declare, which may hold the member.
func (m *module) member(t typeRef, name string, seen map[typeRef]bool) (next typeRef, found, unsure bool) {
	if t.p == nil || seen[t] {
		return typeRef{}, false, t.p == nil
	}
	seen[t] = true
	td := t.p.types[t.name]
	if td == nil {
		return typeRef{}, false, true
	}
	if td.methods[name] {
		return typeRef{}, true, false
	}
	if ft, ok := td.fields[name]; ok {
		return m.typeOf(t.p, ft), true, false
	}
	var inner []ast.Expr
	inner = append(inner, td.embedded...)
	if td.of != nil {
		inner = append(inner, td.of)
	}
	for _, e := range inner {
		et := m.typeOf(t.p, e)
		if et.p == nil {
			unsure = true
			continue
		}
		if n, ok, u := m.member(et, name, seen); ok {
			return n, true, false
		} else if u {
			unsure = true
		}
	}
	return typeRef{}, false, unsure
}

// resolveDotted checks a dotted name X.Y[.Z...] found in p's doc. checked
// is false when X is nothing of the module, so the name is not one of its.
func (m *module) resolveDotted(p *pkg, parts []string) (checked bool, why string) {
	x := parts[0]
	var cur typeRef
	rest := parts[1:]
	switch {
	case p.types[x] != nil:
		cur = typeRef{p, x}
	case p.top[x] != nil:
		cur = m.typeOf(p, p.top[x])
		if cur.p == nil {
			return true, "" // a variable of a type the module does not declare
		}
	case hasKey(p.top, x):
		return true, "" // a function, or a variable of unknown type
	default:
		q := m.qualifier(p, x)
		if q == nil {
			return false, ""
		}
		y := rest[0]
		rest = rest[1:]
		if !hasKey(q.top, y) {
			return true, fmt.Sprintf("package %s (%s) declares no %s", q.name, q.dir, y)
		}
		if q.types[y] == nil {
			if q.top[y] == nil || len(rest) == 0 {
				return true, ""
			}
			cur = m.typeOf(q, q.top[y])
		} else {
			cur = typeRef{q, y}
		}
		x = q.name + "." + y
	}
	for _, name := range rest {
		if cur.p == nil {
			return true, ""
		}
		next, found, unsure := m.member(cur, name, map[typeRef]bool{})
		if !found {
			if unsure {
				return true, ""
			}
			return true, fmt.Sprintf("%s has no field or method %s", x, name)
		}
		x += "." + name
		cur = next
	}
	return true, ""
}

// qualifier returns the package of the module that x names in p's doc:
// one p imports under that name, else the one package of the module by that
// name. nil when x names an imported package of another module, or nothing.
func (m *module) qualifier(p *pkg, x string) *pkg {
	if ip, ok := p.imports[x]; ok {
		return m.byPath[ip]
	}
	if x == p.name {
		return p
	}
	if qs := m.byName[x]; len(qs) == 1 {
		return qs[0]
	}
	return nil
}

// resolveBare checks a name written alone: an unexported one must be
// declared in p; an exported one may also be declared in any package of the
// module or in a package p imports.
func (m *module) resolveBare(p *pkg, name string) (why string) {
	if allowed[name] || p.declares(name, true) {
		return ""
	}
	if token.IsExported(name) {
		for _, q := range m.byDir {
			if q.declares(name, false) {
				return ""
			}
		}
		for _, ip := range p.imports {
			if q := m.ext[ip]; q != nil && q.declares(name, false) {
				return ""
			}
		}
	}
	return fmt.Sprintf("package %s declares no %s", p.name, name)
}

// declares reports whether name is declared in p at top level or as a field
// or method, or with locals set, anywhere.
func (p *pkg) declares(name string, locals bool) bool {
	return hasKey(p.top, name) || p.members[name] || locals && p.locals[name]
}

func hasKey(m map[string]ast.Expr, k string) bool {
	_, ok := m[k]
	return ok
}

// checkDoc returns the problems of p's doc.go.
func (m *module) checkDoc(p *pkg) []Problem {
	raw, err := os.ReadFile(filepath.Join(m.root, filepath.FromSlash(p.docFile)))
	if err != nil {
		return []Problem{{File: p.docFile, Name: p.docFile, Why: err.Error()}}
	}
	var problems []Problem
	seen := map[string]bool{}
	report := func(name, why string) {
		if why == "" || seen[name] {
			return
		}
		seen[name] = true
		problems = append(problems, Problem{File: p.docFile, Line: lineOf(raw, name), Name: name, Why: why})
	}
	// Every [Name], [Recv.Name] and [pkg.Name] is a doc link, to be checked,
	// rather than only those that exist.
	links := comment.Parser{
		LookupPackage: func(name string) (string, bool) { return name, true },
		LookupSym:     func(recv, name string) bool { return true },
	}
	for _, cg := range p.doc.Comments {
		d := links.Parse(cg.Text())
		for _, t := range texts(d.Content) {
			switch t := t.(type) {
			case comment.Plain:
				for _, w := range words(string(t)) {
					report(w, m.checkWord(p, w, false))
				}
				for _, q := range backquoted.FindAllStringSubmatch(string(t), -1) {
					if word.FindString(q[1]) == q[1] {
						report(q[1], m.checkWord(p, q[1], true))
					}
				}
			case *comment.DocLink:
				report(docLinkName(t), m.checkDocLink(p, t))
			}
		}
	}
	return problems
}

// texts returns the inline text of blocks, code blocks left out.
func texts(blocks []comment.Block) []comment.Text {
	var out []comment.Text
	inline := func(ts []comment.Text) {
		for _, t := range ts {
			switch t := t.(type) {
			case comment.Plain, *comment.DocLink:
				out = append(out, t)
			case comment.Italic:
				out = append(out, comment.Plain(t))
			case *comment.Link:
				// A URL's text is the URL or prose about it: not read.
			}
		}
	}
	for _, b := range blocks {
		switch b := b.(type) {
		case *comment.Paragraph:
			inline(b.Text)
		case *comment.Heading:
			inline(b.Text)
		case *comment.List:
			for _, it := range b.Items {
				out = append(out, texts(it.Content)...)
			}
		}
	}
	return out
}

func docLinkName(l *comment.DocLink) string {
	var b strings.Builder
	if l.ImportPath != "" {
		b.WriteString(l.ImportPath + ".")
	}
	if l.Recv != "" {
		b.WriteString(l.Recv + ".")
	}
	b.WriteString(l.Name)
	return b.String()
}

// checkDocLink checks a doc link: [Name], [Recv.Name], [pkg.Name] or
// [pkg.Recv.Name].
func (m *module) checkDocLink(p *pkg, l *comment.DocLink) string {
	q := p
	if l.ImportPath != "" {
		q = m.byPath[l.ImportPath]
		if q == nil {
			if ip, ok := p.imports[l.ImportPath]; ok {
				q = m.byPath[ip]
			} else if qs := m.byName[l.ImportPath]; len(qs) == 1 {
				q = qs[0]
			}
		}
		if q == nil {
			return "" // a package of another module
		}
	}
	parts := []string{l.Name}
	if l.Recv != "" {
		parts = []string{strings.TrimPrefix(l.Recv, "*"), l.Name}
	}
	if len(parts) == 1 {
		if !hasKey(q.top, parts[0]) {
			return fmt.Sprintf("package %s declares no %s", q.name, parts[0])
		}
		return ""
	}
	if q.types[parts[0]] == nil {
		return fmt.Sprintf("package %s declares no type %s", q.name, parts[0])
	}
	_, why := m.resolveDotted(q, parts)
	return why
}

// word matches a word that may be a Go name: identifiers joined by dots,
// with the () of a call after the last.
var word = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?`)

// words returns the words of s that have a Go name's form, as written.
func words(s string) []string {
	var out []string
	for _, loc := range word.FindAllStringIndex(s, -1) {
		w := s[loc[0]:loc[1]]
		// Part of a path, a flag, a host name or a longer word: cmd/chimed,
		// --wheel-horizon, a.example.
		if loc[0] > 0 && strings.ContainsRune("/-.@$%:#", rune(s[loc[0]-1])) {
			continue
		}
		if loc[1] < len(s) && strings.ContainsRune("/-@", rune(s[loc[1]])) {
			continue
		}
		out = append(out, w)
	}
	return out
}

// innerCapital matches a capital letter after a lower-case one: horizonLoop,
// NotPermittedError.
var innerCapital = regexp.MustCompile(`[a-z][A-Z]`)

// backquoted matches a backquoted stretch of prose: `stop`.
var backquoted = regexp.MustCompile("`([^`]+)`")

// checkWord checks one word of prose; "" when it resolves or is not a name.
// A backquoted word is a name whatever its form.
func (m *module) checkWord(p *pkg, w string, backquoted bool) string {
	call := strings.HasSuffix(w, "()")
	w = strings.TrimSuffix(w, "()")
	parts := strings.Split(w, ".")
	if len(parts) > 1 {
		if fileExts[parts[len(parts)-1]] {
			return ""
		}
		_, why := m.resolveDotted(p, parts)
		return why
	}
	if !backquoted && !call && !innerCapital.MatchString(w) && !mixedUnderscore(w) {
		return ""
	}
	return m.resolveBare(p, w)
}

// mixedUnderscore reports whether w has an underscore and both upper- and
// lower-case letters, as generated Go names do (RecurringRule_Cron);
// all-lower (metric names, JSON keys) and all-upper (gRPC codes, variables
// of the environment) words are not Go names.
func mixedUnderscore(w string) bool {
	return strings.Contains(w, "_") && strings.ToLower(w) != w && strings.ToUpper(w) != w
}

// lineOf returns the first line of raw where name is written, 0 if none.
func lineOf(raw []byte, name string) int {
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, name) {
			return i + 1
		}
	}
	return 0
}
