# Sourced by the benches: a throwaway CA and a certificate for 127.0.0.1 it signs (P-256, one day).
#   throwaway_ca DIR NAME   # writes DIR/ca.pem (trust it: SIWA_CA_FILE, curl --cacert), DIR/NAME.pem, DIR/NAME.key
throwaway_ca() {
  local dir=$1 name=$2
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj "/CN=siwa bench CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial -days 1 \
    -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
}
