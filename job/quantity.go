package job

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
)

// Quantities are written as Kubernetes writes them: a decimal number and an
// optional suffix. "500m" is half a CPU, "2" two CPUs, "256Mi" 256 MiB.
// Exponent forms ("1e3") are not accepted: nobody writes them by hand, and
// the JSON Schema keeps to the same grammar.
var quantityRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`)

var quantityScale = map[string]*big.Rat{
	"m":  big.NewRat(1, 1000),
	"":   big.NewRat(1, 1),
	"k":  big.NewRat(1e3, 1),
	"M":  big.NewRat(1e6, 1),
	"G":  big.NewRat(1e9, 1),
	"T":  big.NewRat(1e12, 1),
	"P":  big.NewRat(1e15, 1),
	"E":  big.NewRat(1e18, 1),
	"Ki": new(big.Rat).SetInt64(1 << 10),
	"Mi": new(big.Rat).SetInt64(1 << 20),
	"Gi": new(big.Rat).SetInt64(1 << 30),
	"Ti": new(big.Rat).SetInt64(1 << 40),
	"Pi": new(big.Rat).SetInt64(1 << 50),
	"Ei": new(big.Rat).SetInt64(1 << 60),
}

// parseQuantity returns q multiplied by unit, rounded up to a whole number.
func parseQuantity(q string, unit int64) (int64, error) {
	if v, ok := parseSimpleQuantity(q, unit); ok {
		return v, nil
	}
	m := quantityRE.FindStringSubmatch(q)
	if m == nil {
		return 0, fmt.Errorf("%q is not a quantity (examples: \"500m\", \"2\", \"256Mi\", \"1Gi\")", truncate(q, 32))
	}
	num, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("%q is not a quantity", truncate(q, 32))
	}
	num.Mul(num, quantityScale[m[2]])
	num.Mul(num, new(big.Rat).SetInt64(unit))
	// Round up: a request for 0.5 millicores still needs one.
	i := new(big.Int).Quo(num.Num(), num.Denom())
	if new(big.Rat).SetInt(i).Cmp(num) < 0 {
		i.Add(i, big.NewInt(1))
	}
	if !i.IsInt64() || i.Int64() > maxQuantity {
		return 0, fmt.Errorf("quantity %q is too large", truncate(q, 32))
	}
	return i.Int64(), nil
}

// ParseCPU converts a CPU quantity to millicores: "500m" is 500, "2" is 2000.
func ParseCPU(q string) (int64, error) { return parseQuantity(q, 1000) }

// ParseMemory converts a memory quantity to bytes: "256Mi" is 268435456.
func ParseMemory(q string) (int64, error) { return parseQuantity(q, 1) }

// FormatMemory renders bytes as the shortest exact binary quantity.
func FormatMemory(b int64) string {
	for _, s := range []struct {
		suffix string
		shift  uint
	}{{"Ei", 60}, {"Pi", 50}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if b != 0 && b%(1<<s.shift) == 0 {
			return fmt.Sprintf("%d%s", b>>s.shift, s.suffix)
		}
	}
	return fmt.Sprintf("%d", b)
}

// FormatCPU renders millicores as a CPU quantity: 2000 is "2", 500 is "500m".
func FormatCPU(milli int64) string {
	if milli%1000 == 0 {
		return fmt.Sprintf("%d", milli/1000)
	}
	return fmt.Sprintf("%dm", milli)
}

// maxQuantity is the largest quantity accepted, in units: half of int64,
// so that sums of quantities cannot overflow.
const maxQuantity = math.MaxInt64 / 2

// integerScale holds the suffixes of whole multiples, for the fast path.
var integerScale = map[string]int64{"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}

// parseSimpleQuantity handles the common forms ("2", "500m", "256Mi")
// with integer arithmetic; it reports false for anything else.
func parseSimpleQuantity(q string, unit int64) (int64, bool) {
	i := 0
	var n int64
	for i < len(q) && q[i] >= '0' && q[i] <= '9' {
		n = n*10 + int64(q[i]-'0')
		i++
		if n > 1<<40 {
			return 0, false
		}
	}
	if i == 0 {
		return 0, false
	}
	suffix := q[i:]
	if suffix == "m" {
		return (n*unit + 999) / 1000, true
	}
	scale, ok := integerScale[suffix]
	if !ok || n > maxQuantity/(scale*unit) {
		return 0, false // too large here: the exact path says so
	}
	return n * scale * unit, true
}

// FormatSize writes a size for people, in binary units with one decimal:
// "512 B", "1.5 MiB". sep goes between the number and the unit.
func FormatSize(n int64, sep string) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d%sB", n, sep)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%s%ciB", float64(n)/float64(div), sep, "KMGTPE"[exp])
}
