#pragma once
#include <cudnn_frontend.h>
