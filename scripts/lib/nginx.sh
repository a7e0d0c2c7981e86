# Debian's nginx as an independent HTTP/2 server standing in for APNs: TLS on a loopback port, HTTP/2, every request
# answered 200 with an apns-id header, no cap on requests per connection (APNs keeps a connection for hours).
# nginx_start sets NGINX_DIR, NGINX_PORT, NGINX_CA (the certificate to trust) and NGINX_STATUS_PORT (plain HTTP,
# /status: nginx's stub_status, whose third figure counts every request nginx has read, its own included) and stops
# nginx when the shell exits (after what EXIT trap was set before).

nginx_start() {
    dpkg-query -W -f='${Status}' nginx-light 2>/dev/null | grep -q "install ok installed" || {
        log "installing nginx-light"; apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; }
    NGINX_DIR="$SERVICES_DIR/nginx"; mkdir -p "$NGINX_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
        -addext subjectAltName=IP:127.0.0.1 -keyout "$NGINX_DIR/key.pem" -out "$NGINX_DIR/cert.pem" 2>/dev/null
    NGINX_CA="$NGINX_DIR/cert.pem"
    NGINX_PORT=$(free_port)
    NGINX_STATUS_PORT=$(free_port)
    cat > "$NGINX_DIR/nginx.conf" <<CONF
user root;
worker_processes 1;
pid $NGINX_DIR/nginx.pid;
error_log $NGINX_DIR/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $NGINX_DIR/body; proxy_temp_path $NGINX_DIR/proxy; fastcgi_temp_path $NGINX_DIR/fastcgi;
    uwsgi_temp_path $NGINX_DIR/uwsgi; scgi_temp_path $NGINX_DIR/scgi;
    server {
        listen 127.0.0.1:$NGINX_PORT ssl http2;
        ssl_certificate $NGINX_DIR/cert.pem;
        ssl_certificate_key $NGINX_DIR/key.pem;
        keepalive_requests 100000000;
        http2_max_concurrent_streams 1000;
        location / { add_header apns-id 7a9f8a2e-5c1b-4c8e-9a7d-1b2c3d4e5f60 always; return 200; }
    }
    server {
        listen 127.0.0.1:$NGINX_STATUS_PORT;
        location = /status { stub_status; }
    }
}
CONF
    /usr/sbin/nginx -c "$NGINX_DIR/nginx.conf" -p "$NGINX_DIR" 2>>"$NGINX_DIR/error.log"
    local previous
    previous=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
    trap "/usr/sbin/nginx -c '$NGINX_DIR/nginx.conf' -p '$NGINX_DIR' -s stop 2>/dev/null; $previous" EXIT
}
