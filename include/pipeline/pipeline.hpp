// Umbrella header: everything a program that trains or plans with pipeline needs.
#pragma once

#include <pipeline/core/error.hpp>
#include <pipeline/core/log.hpp>
#include <pipeline/core/rng.hpp>
#include <pipeline/core/tensor.hpp>
#include <pipeline/core/threads.hpp>
#include <pipeline/nn/layer.hpp>
#include <pipeline/nn/layers/linear.hpp>
#include <pipeline/nn/sequential.hpp>
#include <pipeline/ops/bias.hpp>
#include <pipeline/ops/gemm.hpp>
