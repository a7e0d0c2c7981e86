#ifndef C_RABBITMQ_SHIM_H
#define C_RABBITMQ_SHIM_H
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <amqp_ssl_socket.h>

// amqp_login is variadic (its SASL arguments), which Swift cannot call: this fixes it to PLAIN.
static inline amqp_rpc_reply_t CRabbitMQ_login_plain(amqp_connection_state_t state, const char *vhost,
                                                     int channel_max, int frame_max, int heartbeat,
                                                     const char *user, const char *password) {
    return amqp_login(state, vhost, channel_max, frame_max, heartbeat, AMQP_SASL_METHOD_PLAIN, user, password);
}
#endif
