package config

import "strconv"

// Typed reads of the parsed JSON values, each naming the field it reads in
// its error.

// object is a JSON object with the path it was found at.
type object struct {
	v     value
	field string
}

func asObject(v value, field string) (object, error) {
	if v.kind != kindObject {
		what := "the configuration"
		if field != "" {
			return object{}, &FieldError{field, "must be an object, not " + v.kind.String()}
		}
		return object{}, &FieldError{"", what + " must be a JSON object, not " + v.kind.String()}
	}
	return object{v: v, field: field}, nil
}

func (o object) path(name string) string {
	if o.field == "" {
		return name
	}
	return o.field + "." + name
}

func (o object) get(name string) (value, bool) {
	for _, m := range o.v.members {
		if m.name == name {
			return m.value, true
		}
	}
	return value{}, false
}

// only rejects members other than the named ones.
func (o object) only(names ...string) error {
	for _, m := range o.v.members {
		known := false
		for _, n := range names {
			if m.name == n {
				known = true
				break
			}
		}
		if !known {
			return &FieldError{o.path(m.name), "is not a known field"}
		}
	}
	return nil
}

func (o object) requiredString(name string) (string, error) {
	v, ok := o.get(name)
	if !ok {
		return "", &FieldError{o.path(name), "is required"}
	}
	return nonEmptyString(v, o.path(name))
}

func asString(v value, field string) (string, error) {
	if v.kind != kindString {
		return "", &FieldError{field, "must be a string, not " + v.kind.String()}
	}
	return v.text, nil
}

func nonEmptyString(v value, field string) (string, error) {
	s, err := asString(v, field)
	if err == nil && s == "" {
		err = &FieldError{field, "must not be empty"}
	}
	return s, err
}

func asBool(v value, field string) (bool, error) {
	if v.kind != kindBool {
		return false, &FieldError{field, "must be true or false, not " + v.kind.String()}
	}
	return v.boolean, nil
}

// integer accepts a JSON number that is a whole number within [lo, hi].
func integer(v value, field string, lo, hi int64) (int64, error) {
	if v.kind != kindNumber {
		return 0, &FieldError{field, "must be a number, not " + v.kind.String()}
	}
	n, err := strconv.ParseInt(v.text, 10, 64)
	if err != nil {
		return 0, &FieldError{field, "must be a whole number, not " + v.text}
	}
	if n < lo || n > hi {
		return 0, &FieldError{field, "must be between " + strconv.FormatInt(lo, 10) + " and " + strconv.FormatInt(hi, 10)}
	}
	return n, nil
}

// duration accepts a Go duration string ("20ms", "1.5s") or, as protobuf
// JSON writes durations, seconds with an "s" suffix ("0.020s").
func duration(v value, field string) (int64, error) {
	s, err := asString(v, field)
	if err != nil {
		return 0, &FieldError{field, "must be a duration string such as \"20ms\", not " + v.kind.String()}
	}
	d, ok := parseDuration(s)
	if !ok {
		return 0, &FieldError{field, "is not a duration: " + strconv.Quote(s)}
	}
	return d, nil
}
